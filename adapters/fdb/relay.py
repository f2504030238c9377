"""A relay for a process forked after its parent started FoundationDB's
network thread.

That thread cannot be used in the child (fork() copied none of it) nor
started again there (libfdb_c allows one per process image). So such a
child runs its database operations in a relay: a fresh interpreter started
with exec (``python -I -m dbwrap_py.adapters.fdb.relay`` in ``/``, by
``start_python_module``: no module planted in the child's directory is
imported), which opens its own store and network and answers calls on its
stdin and stdout, one length-prefixed ``marshal`` frame each way. It ends
when the child closes the pipe (or dies: the pipe closes with it).

``RelayStore`` is the child's side: the same methods as ``FdbStore``.
"""

from __future__ import annotations

import marshal
import os
import select
import signal
import struct
import subprocess
import sys
from typing import IO, TYPE_CHECKING, Any

from dbwrap_py import errors
from dbwrap_py.errors import DbwrapError, Timeout, Unavailable
from dbwrap_py.servers import start_python_module, stop_process

if TYPE_CHECKING:
    from dbwrap_py.adapters.fdb.library import StoreArgs

_HEADER = struct.Struct(">I")
#: beyond the longest a call may take by its own limits, before its relay counts as hung
REPLY_SLACK = 10.0
#: the FdbStore methods a relay answers
METHODS = frozenset({"take_lease", "wait_for_release", "fenced_write", "release", "get", "scan_page",
                     "seqnum", "wipe", "take_txn_lock", "commit_txn", "release_txn_lock", "close",
                     "ownership", "round_trips", "renew_lease"})


def send(stream: IO[bytes], message: Any) -> None:
    body = marshal.dumps(message)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def receive(stream: IO[bytes], timeout: float | None = None) -> Any:
    """The next frame; TimeoutError if none starts within ``timeout``. (The
    select sees the pipe, not the reader's buffer: that is empty between
    frames, since each call gets exactly one reply.)"""
    if timeout is not None and not select.select([stream], [], [], timeout)[0]:
        raise TimeoutError(f"no reply within {timeout:g} s")
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (length,) = _HEADER.unpack(header)
    return marshal.loads(stream.read(length))


def raise_reply(status: str, result: Any, who: str) -> Any:
    """A reply's result, or its error raised: typed as sent, if one of ours."""
    if status == "ok":
        return result
    kind, message = result
    error = getattr(errors, kind, None)
    if isinstance(error, type) and issubclass(error, DbwrapError):
        raise error(message)
    raise Unavailable(f"{who}: {kind}: {message}")


def error_reply(exc: Exception) -> tuple[str, Any]:
    return ("err", (type(exc).__name__, str(exc)))


def answer(store: Any, method: str, args: Any) -> Any:
    """``store``'s method called, or its attribute read (round_trips)."""
    if method not in METHODS:
        raise Unavailable(f"no method {method!r}")
    attribute = getattr(store, method)
    return attribute(*args) if callable(attribute) else attribute


class RemoteStore:
    """FdbStore's methods, run in another process of this process's own
    (``_call``: one call there, its reply or error)."""

    def _call(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, method: str) -> Any:
        if method not in METHODS:
            raise AttributeError(method)
        return lambda *args: self._call(method, *args)

    @property
    def round_trips(self) -> int:
        return int(self._call("round_trips"))

    def scan_page(self, after: bytes | None, limit: int) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        records, following = self._call("scan_page", after, limit)
        return [tuple(r) for r in records], following  # type: ignore[misc]

    def take_lease(self, *args: Any) -> tuple[bool, bytes | None]:
        return tuple(self._call("take_lease", *args))  # type: ignore[return-value]

    def get(self, key: bytes) -> tuple[bytes | None, bool]:
        return tuple(self._call("get", key))  # type: ignore[return-value]


class RelayStore(RemoteStore):
    """FdbStore's methods, run in a relay process of this process's own.
    ``longest_call``: the most a call may take by its own limits (the
    operation and transaction timeouts); a relay silent for REPLY_SLACK
    beyond it is killed, the call fails with Timeout, and ``gone`` is set."""

    def __init__(self, args: StoreArgs, longest_call: float) -> None:
        self._pid = os.getpid()
        self._reply_timeout = longest_call + REPLY_SLACK
        self.gone = False
        try:
            self._process = start_python_module("dbwrap_py.adapters.fdb.relay", dying=True,
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise Unavailable(f"FoundationDB relay process could not start: {exc}") from exc
        self._call("open", dict(args))

    def _call(self, method: str, *args: Any) -> Any:
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        try:
            send(process.stdin, (method, args))
            status, result = receive(process.stdout, self._reply_timeout)
        except TimeoutError as exc:
            self.gone = True
            stop_process(process, signal.SIGKILL)  # its late reply would answer the next call
            raise Timeout(f"FoundationDB relay process did not answer {method} "
                          f"within {self._reply_timeout:g} s; killed") from exc
        except (OSError, EOFError, ValueError) as exc:
            self.gone = True
            raise Unavailable(f"FoundationDB relay process gone ({exc!r})") from exc
        return raise_reply(status, result, "FoundationDB relay")

    def close(self) -> None:
        if os.getpid() != self._pid or self._process.poll() is not None:
            return
        try:
            self._call("close")
        except Unavailable:
            pass
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The relay's side: open the store, then answer calls until EOF."""
    from dbwrap_py.adapters.fdb import library as library
    from dbwrap_py.adapters.fdb.library import open_store

    store = None
    while True:
        try:
            method, args = receive(stdin)
        except EOFError:
            break
        try:
            if method == "open":
                (given,) = args
                store = open_store(library.load(given["library"], given["api_version"]), given)
                result: Any = None
            elif store is not None:
                result = answer(store, method, args)
            else:
                raise Unavailable("relay: no store yet")
            reply: tuple[str, Any] = ("ok", result)
        except Exception as exc:  # reported to the caller: ours typed, others as Unavailable
            reply = error_reply(exc)
        send(stdout, reply)
    if store is not None:
        store.close()


if __name__ == "__main__":
    # the frames own stdout: anything printed would corrupt them
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, out)
