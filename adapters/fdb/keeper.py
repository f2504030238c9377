"""The opener keeper: a process's place among a volatile database's openers
(TDB_CLEAR_IF_FIRST) while the process has no FoundationDB network.

A volatile database is wiped when it is opened and no process that opened it
lives, as tdb does. An opener shows it lives by an opener key whose expiry
(a read version) is renewed; that takes FoundationDB's network, which smbd's
parent must never start (it opens every database, then forks). So a process
that opens a volatile database before its network runs starts one keeper: a
fresh interpreter, started with exec (``python -I -m
dbwrap_py.adapters.fdb.keeper`` in ``/``, by ``start_python_module``: no
module planted in the process's directory is imported), with a network of
its own. The keeper joins the openers for it (wiping first if no live
opener is left), renews its opener keys, and clears them when the process
closes the database or dies.

One keeper per process, for all its databases. It learns of its process's
death by PR_SET_PDEATHSIG (SIGTERM, set by itself after exec) and, in case
that signal is lost, by its parent PID changing; it then clears its opener
keys at once, as the kernel lets a dead tdb opener's lock go. The pipe is not
how it learns: a forked child holds a copy of it.

``KeeperClient`` is the opening process's side; forked children never use
their parent's (``for_this_process``): they join on their own first
operation, or start their own keeper if they open a database themselves.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import IO, TYPE_CHECKING, Any

from dbwrap_py.adapters.fdb.relay import RemoteStore, answer, error_reply, raise_reply, receive, send
from dbwrap_py.errors import DbwrapError, Timeout, Unavailable
from dbwrap_py.servers import start_python_module, stop_process

if TYPE_CHECKING:
    from dbwrap_py.adapters.fdb.store import FdbStore
    from dbwrap_py.adapters.fdb.library import StoreArgs

_PR_SET_PDEATHSIG = 1
#: how often the keeper looks at its parent PID (the signal is the fast way)
PARENT_POLL = 1.0
#: beyond a join's own limit (two transaction timeouts: fdb.open, then the join) before
#: the keeper counts as hung
REPLY_SLACK = 10.0


def _database(args: StoreArgs) -> tuple[Any, ...]:
    return (args["library"], args["cluster_file"], args["prefix"], args["db"])


class KeeperClient:
    """The opening process's keeper: started on first use, ended at exit."""

    _current: KeeperClient | None = None
    _lock = threading.Lock()

    def __init__(self, opener_ttl: float) -> None:
        self.pid = os.getpid()
        #: database -> how many of this process's opens it holds (the key goes with the last close)
        self.joined: dict[tuple[Any, ...], int] = {}
        try:
            self._process = start_python_module("dbwrap_py.adapters.fdb.keeper",
                                                [str(self.pid), repr(opener_ttl)],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise Unavailable(f"FoundationDB opener keeper could not start: {exc}") from exc

    @classmethod
    def for_this_process(cls, opener_ttl: float) -> KeeperClient:
        with cls._lock:
            keeper = cls._current
            if keeper is None or keeper.pid != os.getpid() or keeper._process.poll() is not None:
                keeper = cls._current = cls(opener_ttl)  # a forked child's inherited one is its parent's
            return keeper

    def _call(self, method: str, args: StoreArgs, call: tuple[str, tuple[Any, ...]] | None = None,
              longest: float = 0.0) -> Any:
        """``method`` (join, leave, or call: ``call`` on the database's store,
        which may take ``longest`` by its own limits) in the keeper."""
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        timeout = 2 * args["timeout_ms"] / 1000 + longest + REPLY_SLACK
        with self._lock:
            try:
                send(process.stdin, (method, (dict(args), call)))
                status, result = receive(process.stdout, timeout)
            except TimeoutError as exc:
                # killed: its late reply would answer the next call; for_this_process starts another
                stop_process(process, signal.SIGKILL)
                raise Timeout(f"FoundationDB opener keeper did not answer {method} within {timeout:g} s; "
                              "killed") from exc
            except (OSError, EOFError, ValueError) as exc:
                raise Unavailable(f"FoundationDB opener keeper gone ({exc!r})") from exc
        return raise_reply(status, result, "FoundationDB opener keeper")

    def join(self, args: StoreArgs) -> int:
        """Join ``args``' openers (wiping if none lives); the wipe's revision."""
        revision = self._call("join", args)
        database = _database(args)
        self.joined[database] = self.joined.get(database, 0) + 1
        return int(revision)

    @classmethod
    def leave(cls, args: StoreArgs) -> None:
        """One of this process's opens of ``args``' database closed."""
        keeper, database = cls._current, _database(args)
        if keeper is None or os.getpid() != keeper.pid or database not in keeper.joined:
            return
        keeper.joined[database] -= 1
        if keeper.joined[database]:
            return
        del keeper.joined[database]
        try:
            keeper._call("leave", args)
        except (Unavailable, Timeout):
            pass  # its opener key expires by itself


# -- the keeper process ------------------------------------------------------------


class _Keeper:
    def __init__(self, parent: int, opener_ttl: float) -> None:
        self.parent = parent
        self.opener_ttl = opener_ttl
        #: the databases whose openers it joined
        self.stores: dict[tuple[Any, ...], FdbStore] = {}
        #: stores it only runs calls on (persistent databases), kept until it exits
        self.served: dict[tuple[Any, ...], FdbStore] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def join(self, args: StoreArgs, _: None) -> int:
        with self.lock:
            store = self.stores.get(_database(args))
            if store is None:
                store = _open(args)
                store.join_openers()
                self.stores[_database(args)] = store
            return store.wipe_revision

    def call(self, args: StoreArgs, call: tuple[str, tuple[Any, ...]]) -> Any:
        """One of the store's methods, for a process that must not start the network."""
        database = _database(args)
        with self.lock:
            store = self.stores.get(database) or self.served.get(database)
            if store is None:
                store = self.served[database] = _open(args)
        method, method_args = call
        if method == "close":
            return None  # joined: its leave closes it; served: kept, for the process's other opens
        return answer(store, method, method_args)

    def leave(self, args: StoreArgs, _: None) -> None:
        with self.lock:
            store = self.stores.pop(_database(args), None)
        if store is not None:
            store.close()

    def renew(self) -> None:
        """One thread renews every opener key (not one per database)."""
        while not self.stop.wait(self.opener_ttl / 3):
            with self.lock:
                stores = list(self.stores.values())
            for store in stores:
                try:
                    store.renew_opener()
                except DbwrapError:
                    pass  # again in a third of the TTL: the expiry has room for two misses

    def serve(self, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        while not self.stop.is_set():
            try:
                method, args = receive(stdin)
            except (EOFError, OSError):
                self.stop.set()  # the parent and every child holding the pipe are gone
                return
            try:
                if method not in ("join", "leave", "call"):
                    raise Unavailable(f"opener keeper: no method {method!r}")
                reply: tuple[str, Any] = ("ok", getattr(self, method)(*args))
            except Exception as exc:  # the opener raises it: ours typed, others as Unavailable
                reply = error_reply(exc)
            send(stdout, reply)

    def leave_all(self) -> None:
        with self.lock:
            stores, self.stores = [*self.stores.values(), *self.served.values()], {}
            self.served = {}
        for store in stores:
            store.close()  # clears its opener key: a dead process is no opener


def _open(args: StoreArgs) -> FdbStore:
    from dbwrap_py.adapters.fdb import library as library
    from dbwrap_py.adapters.fdb.library import open_store

    return open_store(library.load(args["library"], args["api_version"]), {**args, "join": False})


class KeeperStore(RemoteStore):
    """FdbStore's methods for a database the calling process opened, run in
    that process's keeper: a process that opened a database never starts
    the network itself, since it may fork next (smbd's parent runs a few
    operations, such as smbXsrv_version_global_init, then forks every
    child). Its children start their own."""

    def __init__(self, args: StoreArgs, longest_call: float) -> None:
        self._args = args
        self._longest = longest_call

    def _call(self, method: str, *args: Any) -> Any:
        # a keeper that hung and was killed is replaced here
        keeper = KeeperClient.for_this_process(self._args["opener_ttl"])
        return keeper._call("call", self._args, (method, args), self._longest)


def main(parent: int, opener_ttl: float) -> None:
    keeper = _Keeper(parent, opener_ttl)
    # SIGTERM is taken by sigtimedwait below, never by a handler: a handler
    # that set the stop event could run inside that event's own lock (the
    # loop's set() below) and deadlock, leaving the keeper alive after its
    # parent, holding its parent's stderr. Blocked before the threads start,
    # so they inherit the mask.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    # the frames own stdout: anything printed would corrupt them
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    threading.Thread(target=keeper.serve, args=(sys.stdin.buffer, out), daemon=True, name="requests").start()
    threading.Thread(target=keeper.renew, daemon=True, name="renew").start()
    # the poll covers a parent that died before prctl, or a signal that did not come
    while not keeper.stop.is_set() and os.getppid() == parent:
        if signal.sigtimedwait({signal.SIGTERM}, PARENT_POLL) is not None:
            break
    keeper.stop.set()
    keeper.leave_all()


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
