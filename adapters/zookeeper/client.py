"""What the zookeeper adapter needs of kazoo (Debian's python3-kazoo).

* ``Session``: one kazoo client, that is one ZooKeeper session, per process
  and configuration (``session_for``); a forked child gets a session of its
  own and never touches, stops or closes its parent's (kazoo's threads do
  not survive a fork, and stopping would end the parent's session).
* Every call is asynchronous underneath and waited for at most
  ``op_timeout``: none waits forever, not even on a dead server.
* kazoo's errors become the project's typed ones (``dbwrap_py.errors``);
  kazoo's own log stays quiet, since the bridge logs each error raised once.
* ``multi`` is ZooKeeper's atomic multi-op (kazoo's ``transaction``), with
  ops as tuples: ``("create", path, data, ephemeral)``, ``("set", path,
  data[, version])``, ``("delete", path[, version])``, ``("check", path)``
  (exists).
* ``create_all``: a multi that takes locks, refused if one is taken.
* ``write``: a fenced write of one record, its existence guessed;
  ``let_go_if_lost``: a lock whose take or release had its answer lost goes.
* ``get_versioned``, ``ensure``, ``remove_tree``: what a volatile
  database's openers (``openers.py``) ask beyond ``multi``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from dbwrap_py.errors import AccessDenied, DbwrapError, LockConflict, Timeout, Unavailable
from dbwrap_py.retry import Backoff, retry_until

Op = tuple[Any, ...]
#: kazoo logs every reconnect try; the bridge already logs each error we raise
_QUIET = logging.getLogger("dbwrap_py.adapters.zookeeper.kazoo")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
#: between two tries of a multi after a lost connection or session
RECONNECT = Backoff(first=0.05, cap=0.2)


@dataclasses.dataclass(frozen=True)
class ZkConfig:
    hosts: str  # host:port,host:port
    session_timeout: float  # seconds; the server may clamp it to its own bounds
    op_timeout: float  # seconds, for each call


def record_ops(path: str, value: bytes | None, present: bool) -> list[Op]:
    """The ops that store ``value`` at ``path`` (None: delete), were it ``present`` or not."""
    if value is None:
        return [("delete", path)] if present else []
    return [("set", path, value)] if present else [("create", path, value, False)]


def until(done: Callable[[], bool], seconds: float, nonblock: bool, what: str) -> None:
    """Poll ``done`` (dbwrap_py.retry's backoff) until it holds or ``seconds`` pass."""
    for _ in retry_until(time.monotonic() + seconds):
        if done():
            return
        if nonblock:
            raise LockConflict(f"zookeeper: {what} held by another process")
    raise Timeout(f"zookeeper: {what} still held after {seconds:g} s")


class Session:
    """One ZooKeeper session of this process (see the module docstring)."""

    def __init__(self, config: ZkConfig) -> None:
        self.config = config
        self.users = 0
        self.round_trips = 0
        #: (fence, lock) pairs a lost answer may have left ours: let go, waited for, before the next multi
        self._unreleased: list[tuple[str, str]] = []
        retry = {"max_tries": -1, "delay": 0.05, "max_delay": 1.0}  # reconnect soon after an outage
        self.client = KazooClient(hosts=config.hosts, timeout=config.session_timeout,
                                  connection_retry=retry, logger=_QUIET)
        try:
            self.client.start(timeout=max(config.op_timeout, 0.1))
        except KazooTimeoutError:
            self.stop()
            raise Unavailable(f"zookeeper: no session with {config.hosts} within {config.op_timeout:g} s") from None

    @contextmanager
    def _mapped(self, what: str) -> Iterator[None]:
        try:
            yield
        except KazooTimeoutError:
            raise Timeout(f"zookeeper: {what}: no answer within {self.config.op_timeout:g} s") from None
        except NoAuthError as exc:
            raise AccessDenied(f"zookeeper: {what}: {exc!r}") from None
        except (ConnectionLoss, ConnectionClosedError, SessionExpiredError) as exc:
            raise Unavailable(f"zookeeper: {what}: {type(exc).__name__}") from exc
        except KazooException as exc:
            raise Unavailable(f"zookeeper: {what}: {exc!r}") from None

    def _wait(self, pending: Any, what: str, timeout: float | None = None) -> Any:
        """``pending``'s result, None for a missing znode."""
        with self._mapped(what):
            try:
                return pending.get(timeout=self.config.op_timeout if timeout is None else timeout)
            except NoNodeError:
                return None

    def get_many(self, paths: Sequence[str]) -> list[bytes | None]:
        """Each znode's data (None: missing), the reads sent together."""
        self.round_trips += 1
        pending = [self.client.get_async(p) for p in paths]
        replies = [self._wait(reply, f"get {path}") for path, reply in zip(paths, pending)]
        return [None if reply is None else reply[0] for reply in replies]

    def get_versioned(self, path: str) -> tuple[bytes | None, int]:
        """A znode's data and version (missing: None and -1)."""
        self.round_trips += 1
        reply = self._wait(self.client.get_async(path), f"get {path}")
        return (None, -1) if reply is None else (reply[0], reply[1].version)

    def stat(self, path: str, timeout: float | None = None) -> Any:
        self.round_trips += 1
        return self._wait(self.client.exists_async(path), f"stat {path}", timeout)

    def child_changes(self, path: str, stop: threading.Event, poll: float = 1.0,
                      read: Callable[[dict[str, tuple[bytes, int]]], None] | None = None
                      ) -> Iterator[tuple[str, bool]]:
        """(name, True) for each child of ``path`` as it comes (a kazoo
        watch), and for every one there again after ``poll`` seconds without
        a change; (name, False) for each one gone; until ``stop``. ``read``
        is given the data and version of the ones about to be yielded as
        there, read together (one round trip; those gone meanwhile left out)."""
        woken, seen, there = threading.Event(), set(), set()

        def watcher(_event: object) -> None:  # one function: kazoo keeps one watcher
            woken.set()

        while not stop.is_set():
            woken.clear()
            names = set(self._wait(self.client.get_children_async(path, watch=watcher), f"watch {path}") or [])
            yield from ((name, False) for name in sorted(there - names))
            new = sorted(names - seen)
            if read is not None and new:
                self.round_trips += 1
                pending = [self.client.get_async(f"{path}/{name}") for name in new]
                replies = [self._wait(reply, f"get {path}/{name}") for name, reply in zip(new, pending)]
                read({name: (reply[0], reply[1].version) for name, reply in zip(new, replies) if reply is not None})
            yield from ((name, True) for name in new)
            there = names
            seen = names if woken.wait(poll) else set()

    def children(self, *paths: str) -> list[str]:
        """The children of ``paths`` (one list, the requests sent together)."""
        self.round_trips += 1
        pending = [self.client.get_children_async(path) for path in paths]
        return [name for path, reply in zip(paths, pending) for name in self._wait(reply, f"children of {path}") or []]

    def multi(self, ops: Sequence[Op], retry: bool = False) -> tuple[int, Exception] | None:
        """Apply ``ops`` atomically: None, or (index, error) of the op that
        failed. With ``retry`` (``ops`` may be applied twice), a lost
        connection or session is tried again until op_timeout: after a
        session expired, a new one answers."""
        return self.multis([ops], retry)[0]

    def multis(self, batches: Sequence[Sequence[Op]], retry: bool = False) -> list[tuple[int, Exception] | None]:
        """``multi`` of each batch, all sent at once (one round trip) and
        applied in their order; each one's answer."""
        lost: Unavailable | None = None
        for _ in retry_until(time.monotonic() + self.config.op_timeout, RECONNECT):
            try:
                self._let_go_unreleased()
                self.round_trips += 1
                pending = [self._commit(ops) for ops in batches]
                return [self._failed(self._wait(reply, f"multi of {len(ops)} ops"))
                        for ops, reply in zip(batches, pending)]
            except Unavailable as exc:
                if not (retry and isinstance(exc.__cause__, (ConnectionLoss, SessionExpiredError))):
                    raise
                lost = exc
        assert lost is not None  # every try raised it, or returned
        raise lost

    def _multi(self, ops: Sequence[Op]) -> tuple[int, Exception] | None:
        self.round_trips += 1
        return self._failed(self._wait(self._commit(ops), f"multi of {len(ops)} ops"))

    def _commit(self, ops: Sequence[Op]) -> Any:
        """``ops`` sent as one multi, unwaited."""
        txn = self.client.transaction()
        for kind, path, *rest in ops:
            if kind == "create":
                txn.create(path, rest[0], ephemeral=rest[1])
            elif kind == "set":  # rest: data, and the version expected, if any
                txn.set_data(path, *rest)
            elif kind == "delete":  # rest: the version expected, if any
                txn.delete(path, *rest)
            else:
                txn.check(path, -1)
        return txn.commit_async()

    @staticmethod
    def _failed(results: Sequence[Any]) -> tuple[int, Exception] | None:
        return next(((i, r) for i, r in enumerate(results)
                     if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)

    def multi_reading(self, ops: Sequence[Op], paths: Sequence[str] = (), folders: Sequence[str] = (),
                      stats: Sequence[str] = ()
                      ) -> tuple[tuple[int, Exception] | None, list[bytes | None], list[list[str]], list[Any]]:
        """``multi`` (not tried again), then each of ``paths``' data, of
        ``folders``' children and of ``stats``' stat (None: missing) as
        they are right after it, in the same round trip: ZooKeeper applies
        a session's requests in the order they were sent."""
        self._let_go_unreleased()
        self.round_trips += 1
        committed = self._commit(ops)
        pending = [self.client.get_async(p) for p in paths]
        listed = [self.client.get_children_async(folder) for folder in folders]
        looked = [self.client.exists_async(p) for p in stats]
        failed = self._failed(self._wait(committed, f"multi of {len(ops)} ops"))
        replies = [self._wait(reply, f"get {path}") for path, reply in zip(paths, pending)]
        names = [self._wait(reply, f"children of {folder}") or [] for folder, reply in zip(folders, listed)]
        found = [self._wait(reply, f"stat {path}") for path, reply in zip(stats, looked)]
        return failed, [None if reply is None else reply[0] for reply in replies], names, found

    def stat_many(self, paths: Sequence[str]) -> list[Any]:
        """Each znode's stat (None: missing), the requests sent together."""
        self.round_trips += 1
        pending = [self.client.exists_async(p) for p in paths]
        return [self._wait(reply, f"stat {path}") for path, reply in zip(paths, pending)]

    def create_all(self, ops: Sequence[Op], what: str) -> bool:
        """``ops`` (creates among them) in one multi: False if a create
        found its znode there; any other failure is Unavailable."""
        failed = self.multi(ops)
        if failed is not None and not isinstance(failed[1], NodeExistsError):
            raise Unavailable(f"zookeeper: {what}: {failed[1]!r}")
        return failed is None

    @contextmanager
    def let_go_if_lost(self, fence: str, lock: str) -> Iterator[None]:
        """Around a take or release of a lock: an answer lost may have
        landed, and then our live session would hold the lock until the
        process ends. So ``fence`` and ``lock`` go: one multi, which fails
        unless our fence, named by our token, is there, so never another's
        lock. It is sent at once, unwaited (the call's error stays within
        op_timeout; a session sends in order, so a late take lands first),
        and sent again, waited for, before our next multi (a lost
        connection drops what was sent on it)."""
        try:
            yield
        except (Unavailable, Timeout):  # no answer in time: it may land yet
            self._unreleased.append((fence, lock))
            with suppress(Exception):  # kazoo's own errors on a closed connection: the next multi's try
                txn = self.client.transaction()
                txn.delete(fence)
                txn.delete(lock)
                txn.commit_async()
            raise

    def _let_go_unreleased(self) -> None:
        """The pairs ``let_go_if_lost`` could not let go: each one multi,
        which fails harmlessly unless our fence is there."""
        while self._unreleased:
            fence, lock = self._unreleased[0]
            self._multi([("delete", fence), ("delete", lock)])  # raises while still away: kept
            self._unreleased.pop(0)

    def write(self, path: str, seq: str, fence: Sequence[Op], value: bytes | None, retry: bool = False,
              together: bool = False) -> bool:
        """``fence``, then ``value`` at ``path`` (None: delete) and a set of
        ``seq``, in one multi; False if the fence failed. A record's existence
        is guessed, and the guess flipped once if wrong. ``retry``: as ``multi``.
        ``together`` (a fence that ``fence`` itself ends: a write-back): the
        multi for each guess sent at once, one round trip; the fence lets
        the right one apply, the other fails."""
        guesses = [[*fence, *record_ops(path, value, present), ("set", seq, b"")] for present in (True, False)]
        if together:
            failed = self.multis(guesses, retry)
        else:
            failed = []
            for ops in guesses:
                failed.append(self.multi(ops, retry))
                if failed[-1] is None or failed[-1][0] < len(fence):
                    break
        if None in failed:
            return True
        if any(f is not None and f[0] < len(fence) for f in failed):
            return False
        raise Unavailable(f"zookeeper: writing {path}: {failed[-1][1]!r}")  # type: ignore[index]

    def send(self, ops: Sequence[Op]) -> None:
        """``ops`` as one multi, unwaited: its answer is not read (the
        session's next request is applied after it)."""
        self.round_trips += 1
        with suppress(Exception):  # kazoo's own errors on a closed connection: the caller asks again
            self._commit(ops)

    def forget(self, path: str, version: int = -1) -> None:
        """Delete ``path`` if it is there (at ``version``, if given), unwaited
        (a served release request)."""
        self.client.delete_async(path, version)

    def ensure(self, *paths: str) -> None:
        for path in paths:
            with self._mapped(f"ensure {path}"):
                self.client.ensure_path_async(path).get(timeout=self.config.op_timeout)

    def remove_tree(self, path: str) -> None:
        """Delete ``path`` and everything under it, best effort (an old generation)."""
        try:
            for child in self.children(path):
                self.remove_tree(f"{path}/{child}")
            self.multi([("delete", path)])
        except DbwrapError:
            pass

    def stop(self) -> None:
        """End the session, waiting at most op_timeout. kazoo's stop waits
        for its connection thread, which a server that holds the connection
        but does not answer keeps until the read timeout (2/3 of the
        session): past op_timeout a daemon thread finishes the stop, or the
        server expires the session."""
        stopping = threading.Thread(target=self._stop, name="zookeeper-stop", daemon=True)
        stopping.start()
        stopping.join(max(self.config.op_timeout, 0.1))

    def _stop(self) -> None:
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # a failed stop leaves nothing worse than a session that expires
            pass


_sessions: dict[ZkConfig, Session] = {}
_inherited: list[Session] = []  # a child keeps its parent's, so nothing of them is finalised
_pid = os.getpid()


def session_for(config: ZkConfig) -> Session:
    """This process's session for ``config``; a forked child's first call
    drops every session inherited from its parent, unused and unclosed."""
    global _pid
    if _pid != os.getpid():
        _inherited.extend(_sessions.values())
        _sessions.clear()
        _pid = os.getpid()
    session = _sessions.get(config)
    if session is None:
        session = _sessions[config] = Session(config)
    session.users += 1
    return session


def let_go(session: Session) -> None:
    """One user fewer; the last one ends the session (in its own process only)."""
    session.users -= 1
    if session.users <= 0 and _pid == os.getpid() and _sessions.get(session.config) is session:
        del _sessions[session.config]
        session.stop()
