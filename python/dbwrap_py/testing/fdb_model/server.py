"""The server of the model of FoundationDB: one store shared by every client
process, on a unix socket, or on TCP at one IPv4 address of this host (a
networked cluster's bridge address, where nodes in namespaces of their own
reach it through the network profile's delay relay). A model, not
FoundationDB: no replication, no durability, one process; what it does keep
is the transaction semantics an adapter relies on.

* **Versions.** A read version is the store's version clock, which advances
  about 1,000,000 per second (as FoundationDB's does) and never goes back;
  a commit gets a version above every read version handed out so far.
* **MVCC.** Each key keeps its values by version for the last
  ``too_old_seconds``; a read at a read version sees the store as of that
  version.
* **Optimistic conflicts.** A commit whose read-conflict ranges intersect
  the write-conflict ranges of a transaction committed after its read
  version fails with 1020 not_committed, and nothing of it is applied.
* **transaction_too_old.** A read or commit at a read version older than
  ``too_old_seconds`` (5 s, as FoundationDB's MVCC window) fails with 1007.
* **Watches** wake when the key's value differs from the one the watcher saw.
* **Injected faults** (``inject``): the next commits fail with 1021
  commit_unknown_result, applied or not (as the real one: the client cannot
  know), or with 1020.

Who may connect: anyone who reaches it, with no peer check on either
socket. It is a test and benchmark server (``tests_only``): the unix socket
is open to every local user, as a real cluster's TCP port would be (smbd's
children connect as the connected user); on TCP it listens on the one
address it is given, never a wildcard: the bridge address of the network
namespaces root made for a cluster (SambaCluster's ``throwaway_host``),
which those namespaces and this host's own processes reach, as any local
user reaches the unix socket. Never give it an address other machines reach.

Run: ``python -m dbwrap_py.testing.fdb_model.server --socket PATH``, or
``--tcp ADDRESS --port-file PATH``: on a free port at ADDRESS, written to
PATH (``<port>`` and a newline, whole once it exists) when it listens.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import ipaddress
import os
import random
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dbwrap_py.errors import ConfigError
from dbwrap_py.testing.fdb_model import _wire
from dbwrap_py.testing.fdb_model.tests_only import require_test_run

#: FoundationDB's error codes that the server returns
NOT_COMMITTED = 1020
TRANSACTION_TOO_OLD = 1007
COMMIT_UNKNOWN_RESULT = 1021
#: how long one watch request blocks before the client asks again (so a
#: cancelled watch's server thread ends)
WATCH_SLICE = 1.0
VERSIONS_PER_SECOND = 1_000_000
#: commits between sweeps of keys deleted long ago (memory stays bounded)
SWEEP_EVERY = 1000

Range = tuple[bytes, bytes]


class ModelError(Exception):
    """An FDB error code for the client to raise as FDBError."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _overlaps(a: Range, b: Range) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _add_le(old: bytes | None, param: bytes) -> bytes:
    """FoundationDB's atomic ADD: little-endian, the width of ``param``."""
    width = len(param)
    current = int.from_bytes((old or b"")[:width].ljust(width, b"\0"), "little")
    total = (current + int.from_bytes(param, "little")) % (1 << (8 * width))
    return total.to_bytes(width, "little")


class Store:
    """The versioned key-value store and its conflict history."""

    def __init__(self, too_old_seconds: float = 5.0) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.keys: list[bytes] = []  # sorted, every key that has ever had a version
        self.versions: dict[bytes, list[tuple[int, bytes | None]]] = {}
        #: (commit version, write-conflict ranges) of commits inside the window
        self.history: collections.deque[tuple[int, list[Range]]] = collections.deque()
        self.committed = 0
        self.handed = 0  # the highest read version given out
        self.too_old_seconds = too_old_seconds
        self._start = time.monotonic()
        self.injected: collections.deque[tuple[str, str]] = collections.deque()
        #: kind -> (probability per commit, outcome): a storm rather than a count
        self.rates: dict[str, tuple[float, str]] = {}
        self.counts: collections.Counter[str] = collections.Counter()

    # -- versions --------------------------------------------------------

    def _clock(self) -> int:
        return VERSIONS_PER_SECOND + int((time.monotonic() - self._start) * VERSIONS_PER_SECOND)

    def _window(self) -> int:
        return int(self.too_old_seconds * VERSIONS_PER_SECOND)

    def read_version(self) -> int:
        with self.lock:
            version = max(self._clock(), self.committed)
            self.handed = max(self.handed, version)
            self.counts["grv"] += 1
            return version

    def _check_age(self, read_version: int) -> None:
        if read_version < self._clock() - self._window():
            self.counts["too_old"] += 1
            raise ModelError(TRANSACTION_TOO_OLD)

    # -- reads -----------------------------------------------------------

    def _value_at(self, key: bytes, version: int) -> bytes | None:
        for at, value in reversed(self.versions.get(key, ())):
            if at <= version:
                return value
        return None

    def get(self, read_version: int, key: bytes) -> bytes | None:
        with self.lock:
            self._check_age(read_version)
            return self._value_at(key, read_version)

    def get_range(self, read_version: int, begin: bytes, end: bytes, limit: int,
                  reverse: bool) -> list[tuple[bytes, bytes]]:
        with self.lock:
            self._check_age(read_version)
            keys = self.keys[bisect.bisect_left(self.keys, begin):bisect.bisect_left(self.keys, end)]
            if reverse:
                keys.reverse()
            found = []
            for key in keys:
                value = self._value_at(key, read_version)
                if value is not None:
                    found.append((key, value))
                    if limit and len(found) >= limit:
                        break
            return found

    # -- commits ---------------------------------------------------------

    def commit(self, read_version: int, reads: list[Range], writes: list[Range],
               mutations: list[tuple[Any, ...]]) -> int:
        with self.lock:
            self._check_age(read_version)
            for version, written in self.history:
                if version > read_version and any(_overlaps(r, w) for r in reads for w in written):
                    self.counts["conflicts"] += 1
                    raise ModelError(NOT_COMMITTED)
            # a fault goes to the next commit that would have succeeded
            fault = self.injected.popleft() if self.injected else None
            for kind, (probability, outcome) in self.rates.items():
                if fault is None and random.random() < probability:
                    fault = (kind, outcome)
            if fault is not None and fault[0] == "not_committed":
                self.counts["injected_not_committed"] += 1
                raise ModelError(NOT_COMMITTED)
            apply = fault is None or fault[1] == "applied" or (
                fault[1] == "random" and random.random() < 0.5)
            version = 0
            if apply:
                version = self._apply(writes, mutations)
            if fault is not None:
                self.counts["injected_unknown_applied" if apply else "injected_unknown_dropped"] += 1
                raise ModelError(COMMIT_UNKNOWN_RESULT)
            return version

    def _apply(self, writes: list[Range], mutations: list[tuple[Any, ...]]) -> int:
        version = max(self._clock(), self.committed + 1, self.handed + 1)
        for mutation in mutations:
            kind = mutation[0]
            if kind == "set":
                self._put(mutation[1], version, mutation[2])
            elif kind == "clear":
                self._put(mutation[1], version, None)
            elif kind == "clear_range":
                lo = bisect.bisect_left(self.keys, mutation[1])
                hi = bisect.bisect_left(self.keys, mutation[2])
                for key in self.keys[lo:hi]:
                    if self._value_at(key, version) is not None:
                        self._put(key, version, None)
            elif kind == "add":
                self._put(mutation[1], version, _add_le(self._value_at(mutation[1], version), mutation[2]))
            else:
                raise ModelError(2000)  # client_invalid_operation: a client bug
        self.committed = version
        self.history.append((version, writes))
        cutoff = self._clock() - self._window()
        while self.history and self.history[0][0] < cutoff:
            self.history.popleft()
        self.counts["commits"] += 1
        if self.counts["commits"] % SWEEP_EVERY == 0:
            self._sweep(cutoff)
        self.changed.notify_all()
        return version

    def _sweep(self, cutoff: int) -> None:
        """Forget keys deleted before the window: no read can see them any more."""
        gone = {key for key, entries in self.versions.items()
                if entries[-1][1] is None and entries[-1][0] <= cutoff}
        if gone:
            for key in gone:
                del self.versions[key]
            self.keys = [key for key in self.keys if key not in gone]

    def _put(self, key: bytes, version: int, value: bytes | None) -> None:
        entries = self.versions.get(key)
        if entries is None:
            entries = self.versions[key] = []
            bisect.insort(self.keys, key)
        if entries and entries[-1][0] == version:  # a second mutation in one commit
            entries[-1] = (version, value)
        else:
            entries.append((version, value))
        # versions older than the window are unreadable (1007): keep only the last of them
        cutoff = self._clock() - self._window()
        while len(entries) > 1 and entries[1][0] <= cutoff:
            del entries[0]

    # -- watches ----------------------------------------------------------

    def watch(self, key: bytes, seen: bytes | None, since: int) -> bool:
        """True once ``key`` holds a value other than ``seen`` (written after
        version ``since``); False after WATCH_SLICE, for the client to ask again."""
        deadline = time.monotonic() + WATCH_SLICE
        with self.changed:
            while True:
                entries = self.versions.get(key, ())
                if any(at > since and value != seen for at, value in entries) or (
                        self._value_at(key, 1 << 62) != seen):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)

    # -- control (tests) ---------------------------------------------------

    def inject(self, kind: str, count: int, outcome: str) -> None:
        """The next ``count`` commits fail with ``kind``: "unknown" (1021;
        ``outcome`` applied, dropped or random) or "not_committed" (1020)."""
        if kind not in ("unknown", "not_committed") or outcome not in ("applied", "dropped", "random"):
            raise ModelError(2006)  # invalid_option_value
        with self.lock:
            self.injected.extend([(kind, outcome)] * count)

    def inject_rate(self, kind: str, probability: float, outcome: str) -> None:
        """Each commit that would succeed fails with ``kind`` with this
        probability (0 stops it); a retry is as likely to be hit as the first try."""
        self.inject(kind, 0, outcome)  # validates
        with self.lock:
            if probability > 0:
                self.rates[kind] = (probability, outcome)
            else:
                self.rates.pop(kind, None)

    def configure(self, too_old_seconds: float) -> None:
        with self.lock:
            self.too_old_seconds = too_old_seconds

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {**self.counts, "keys": len(self.keys), "version": max(self._clock(), self.committed)}


def _handler(store: Store) -> type[socketserver.BaseRequestHandler]:
    ops: dict[str, Callable[..., Any]] = {
        "grv": store.read_version, "get": store.get, "get_range": store.get_range,
        "commit": store.commit, "watch": store.watch, "inject": store.inject,
        "inject_rate": store.inject_rate,
        "configure": store.configure, "stats": store.stats,
    }

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            sock: socket.socket = self.request
            while True:
                try:
                    op, *args = _wire.receive(sock)
                except (ConnectionError, OSError, EOFError, ValueError):
                    return
                try:
                    reply: tuple[str, Any] = ("ok", ops[op](*args))
                except ModelError as exc:
                    reply = ("err", exc.code)
                except (KeyError, TypeError):
                    reply = ("err", 2000)  # client_invalid_operation
                try:
                    _wire.send(sock, reply)
                except OSError:
                    return

    return Handler


class ModelServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class TcpModelServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    #: socketserver's 5 would overflow when a cluster's processes connect at
    #: once, and a dropped TCP handshake is retried only after a second
    request_queue_size = socket.SOMAXCONN

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, peer = super().get_request()
        _wire.no_delay(sock)  # the replies are small: Nagle would hold each for the client's ACK
        return sock, peer


def serve(path: str, too_old_seconds: float = 5.0) -> None:
    """Serve on the unix socket ``path`` until killed."""
    if os.path.exists(path):
        os.unlink(path)
    # any local user may connect, as to a real cluster's TCP port: smbd's
    # children run their first operation as the connected user
    old = os.umask(0)
    try:
        server = ModelServer(path, _handler(Store(too_old_seconds)))
    finally:
        os.umask(old)
    print(f"model of FoundationDB serving on {path}", flush=True)
    server.serve_forever()


def serve_tcp(host: str, port_file: Path, too_old_seconds: float = 5.0) -> None:
    """Serve on a free TCP port at ``host`` until killed; the port goes to
    ``port_file`` once the server listens (the kernel picks it at the bind,
    so no other process can take it in between)."""
    server = TcpModelServer((listening_host(host), 0), _handler(Store(too_old_seconds)))
    port = server.server_address[1]
    partial = port_file.with_name(port_file.name + ".partial")
    partial.write_text(f"{port}\n")
    os.replace(partial, port_file)  # whole or absent: the waiter never reads half a number
    print(f"model of FoundationDB serving on {host}:{port}", flush=True)
    server.serve_forever()


def listening_host(host: str) -> str:
    """``host`` if it is one IPv4 address; ConfigError for anything else, a
    wildcard above all: the model checks no peer, so it must not listen on
    every interface."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ConfigError(f"the model of FoundationDB listens on one IPv4 address, not {host!r}") from None
    if address.is_unspecified or address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        raise ConfigError(f"the model of FoundationDB checks no peer: it listens on one address of "
                          f"this host, not {host}")
    return str(address)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="the model of FoundationDB's transactions (for tests)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="unix socket path to serve on")
    where.add_argument("--tcp", metavar="ADDRESS", help="IPv4 address of this host to serve on, on a free port")
    parser.add_argument("--port-file", type=Path, help="with --tcp: where to write the port once listening")
    parser.add_argument("--too-old-seconds", type=float, default=5.0,
                        help="MVCC window: older read versions get 1007 transaction_too_old")
    args = parser.parse_args(argv)
    if args.tcp is not None and args.port_file is None:
        parser.error("--tcp needs --port-file (how else would the clients learn the port)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        require_test_run("the model of FoundationDB's server")
        if args.tcp is not None:
            serve_tcp(args.tcp, args.port_file, args.too_old_seconds)
        else:
            serve(args.socket, args.too_old_seconds)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
