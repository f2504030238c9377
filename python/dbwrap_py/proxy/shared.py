"""The databases the daemon's connections share, and the adapter thread.

One ``Database`` per (name, adapter), counted by the handles that opened it and closed with the last. Every adapter call, opens
included, runs on one thread, the daemon's adapter thread, because:
- adapters are not promised thread-safe, and their databases share one
  client (etcd's per-process session: called from one thread per database,
  smbd's stores failed with FILE_LOCK_CONFLICT under smbtorture);
- a lock taken on one thread may have to be released on that thread (tdb's
  robust mutexes, smbd's locking.tdb and the node cache's files: unlocked
  from another thread, the record stayed locked for good).
The same thread runs the connections' requests, so a request's adapter
call is made inline (taking the hand-offs between threads out took a tdb
fetch from 203 to 65 us).
Nobody waits on that thread while parked, on a record lock or on the
transaction gate.

A connection holds its records as long as it lives (a paused smbd
included), so while any are held the adapter's expiring record locks
(leases) are renewed on that thread, every ``lock_renewal_seconds``.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from concurrent.futures import Future
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from dbwrap_py.database import Database, open_database
from dbwrap_py.proxy.locks import Callback, Outcome, RecordLocks
from dbwrap_py.proxy.loop_tasks import LoopTasks
from dbwrap_py.options import shown_options
from dbwrap_py.proxy.log import log

T = TypeVar("T")
DatabaseKey = tuple[str, str]  # (name, adapter)



def run_on(tasks: LoopTasks, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the adapter thread: inline when already there."""
    if tasks.on_loop_thread():
        return fn(*args)
    return tasks.submit(fn, *args).result()


class SharedDatabase:
    """One open Database, its record locks and its transaction gate."""

    def __init__(self, key: DatabaseKey, options: tuple[str, ...], db: Database,
                 adapter_thread: LoopTasks, on_deadline: Callback | None = None) -> None:
        self.key = key
        self.options = options
        self.name = key[0]
        self.db = db
        self.locks = RecordLocks(on_deadline)
        self.refs = 1
        self._adapter_thread = adapter_thread
        self._gate = threading.Lock()
        self._txn_owner: Hashable | None = None
        self._gate_waiters: collections.deque[tuple[Hashable, Callback]] = collections.deque()
        self.renew_every = db.lock_renewal_seconds()
        self._renewed_at: float | None = None  # None: nothing held, nothing to renew
        self._renewal: Future[None] | None = None

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, an adapter call, on the adapter thread."""
        return run_on(self._adapter_thread, fn, *args)

    def close(self) -> None:
        self.call(self.db.close)

    def takes(self) -> dict[str, int]:
        """What its node cache took from the store ({} without one)."""
        cache = getattr(self.db.adapter, "cache", None)  # nodecache.adapter.CachedAdapter's
        return dict(cache.takes) if cache is not None else {}

    def renew(self, now: float) -> float | None:
        """Queue a renewal of the held records' leases when one is due; when
        the next one is due (None: nothing held, or this adapter's locks
        never expire, so an idle daemon sleeps in its select)."""
        if self.renew_every is None or not self.locks.any_held():
            self._renewed_at = None
            return None
        if self._renewed_at is None:  # the first hold since idle, taken this turn: its lease is new
            self._renewed_at = now
        elif now - self._renewed_at >= self.renew_every:
            behind = self._renewal is not None and not self._renewal.done()
            if not behind:  # queued: the loop runs it after its selects
                self._renewal = self._adapter_thread.submit(self._keep_locks_alive)
            self._renewed_at = now
        return self._renewed_at + self.renew_every

    def _keep_locks_alive(self) -> None:
        try:
            self.db.keep_locks_alive()
        except Exception as exc:  # the next renewal tries again; a lost lease fences writes
            log(f"{self.name}: lock renewal: {type(exc).__name__}: {exc}")

    # -- the transaction gate ---------------------------------------------------

    def enter(self, owner: Hashable, resume: Callback) -> bool:
        """May ``owner`` use the database now? If not, ``resume`` runs when
        the transaction of another connection has ended."""
        with self._gate:
            if self._txn_owner is None or self._txn_owner == owner:
                return True
            self._gate_waiters.append((owner, resume))
            return False

    def take(self, owner: Hashable, resume: Callback, nonblock: bool) -> Outcome:
        """Make ``owner`` the connection with the transaction."""
        with self._gate:
            if self._txn_owner is None or self._txn_owner == owner:
                self._txn_owner = owner
                return Outcome.HELD
            if nonblock:
                return Outcome.BUSY
            self._gate_waiters.append((owner, resume))
            return Outcome.PARKED

    def open_gate(self, owner: Hashable) -> None:
        """``owner``'s transaction ended: everyone parked tries again."""
        with self._gate:
            if self._txn_owner != owner:
                return
            self._txn_owner = None
            waiting = list(self._gate_waiters)
            self._gate_waiters.clear()
        for _, resume in waiting:
            resume()

    def forget(self, owner: Hashable) -> None:
        """``owner`` went away: its parked requests and record waits end."""
        with self._gate:
            self._gate_waiters = collections.deque(w for w in self._gate_waiters if w[0] != owner)
        self.locks.forget(owner)


@dataclass
class DaemonStats:
    """What the daemon counts for its metrics (metrics.py reads them at a
    scrape; counted on the daemon's one thread, so with no lock)."""

    #: adapter calls by operation ("FETCH", "UNLOCK", "TRANSACTION commit", ...)
    adapter_calls: dict[str, int] = field(default_factory=dict)
    #: LOCK requests that parked behind another connection's hold, and how long they waited
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0
    #: node-cache takes of the databases closed since the daemon started (DatabaseTable.takes)
    closed_takes: collections.Counter[str] = field(default_factory=collections.Counter)


class DatabaseTable:
    """The shared databases by (name, adapter)."""

    def __init__(self, adapter_thread: LoopTasks, on_deadline: Callback | None = None) -> None:
        self._on_deadline = on_deadline  # a record wait got a deadline
        self._mutex = threading.Lock()    # the dict; held briefly (the loop and callers of expire take it)
        self._opening = threading.Lock()  # one open at a time, so no name opens twice
        self._open: dict[DatabaseKey, SharedDatabase] = {}
        #: the one thread for adapter calls and the connections' requests
        self.adapter_thread = adapter_thread
        self.stats = DaemonStats()

    def open_count(self) -> int:
        with self._mutex:
            return len(self._open)

    def open(self, name: str, hash_size: int, tdb_flags: int, open_flags: int, mode: int,
             lock_order: int, dbwrap_flags: int, adapter: str, options: Sequence[str]) -> SharedDatabase:
        """A reference to the database; the first open's flags and options
        win, as tdb keeps its first open's flags. Options differ when
        smb.conf changed under running processes: a second Database on
        the same file or keys would have a lock table of its own (two
        connections held one tdb record at once)."""
        key = (name, adapter)
        with self._opening:
            with self._mutex:
                shared = self._open.get(key)
                if shared is not None:
                    shared.refs += 1
            if shared is not None:
                if tuple(options) != shared.options:
                    log(f"{name}: opened again with other options ({shown_options(options)}): "
                        f"it keeps those of its first open ({shown_options(shared.options)}) "
                        "until its last handle closes")
                return shared
            # outside the dict's mutex: an adapter's open may take a network round trip
            db = run_on(self.adapter_thread, open_database, name, hash_size, tdb_flags, open_flags,
                        mode, lock_order, dbwrap_flags, adapter, list(options))
            with self._mutex:
                shared = self._open[key] = SharedDatabase(key, tuple(options), db,
                                                          self.adapter_thread, self._on_deadline)
            return shared

    def release(self, shared: SharedDatabase) -> None:
        """One reference goes; the last closes the database."""
        with self._mutex:
            shared.refs -= 1
            if shared.refs > 0:
                return
            del self._open[shared.key]
            self.stats.closed_takes.update(shared.takes())
        shared.close()

    def takes(self) -> dict[str, int]:
        """Node-cache takes of every database since the daemon started, by
        what was taken ("record", "bucket"): the metrics' counter."""
        with self._mutex:
            total = collections.Counter(self.stats.closed_takes)
            for shared in self._open.values():
                total.update(shared.takes())
        return dict(total)

    def expire(self, now: float) -> float | None:
        """Fail record waits past their deadline; the next deadline, if any."""
        return self._earliest(lambda shared: shared.locks.expire(now))

    def renew(self, now: float) -> float | None:
        """Queue the lease renewals due; when the next is due, if any."""
        return self._earliest(lambda shared: shared.renew(now))

    def _earliest(self, each: Callable[[SharedDatabase], float | None]) -> float | None:
        with self._mutex:
            databases = list(self._open.values())
        times = [t for t in map(each, databases) if t is not None]
        return min(times, default=None)

    def close_all(self) -> None:
        with self._mutex:
            databases = list(self._open.values())
            self._open.clear()
        try:
            for shared in databases:
                shared.close()
        finally:
            self.adapter_thread.shutdown(wait=True)
