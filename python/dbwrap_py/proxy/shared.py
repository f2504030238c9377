"""The databases the daemon's connections share.

One ``Database`` per identical (name, adapter, options), counted by the
handles that opened it and closed with the last. Every adapter call, opens
included, runs on one thread, the daemon's adapter thread:
- adapters are not promised thread-safe, and their databases share one
  client (etcd's per-process session: called from one thread per database,
  smbd's stores failed with FILE_LOCK_CONFLICT under smbtorture);
- a lock taken on one thread may have to be released on that thread (tdb's
  robust mutexes, smbd's locking.tdb and the node cache's files: unlocked
  from another worker, the record stayed locked for good).
Nobody waits on that thread while parked, on a record lock or on the
transaction gate.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from dbwrap_py.database import Database, open_database
from dbwrap_py.proxy.locks import Callback, Outcome, RecordLocks

T = TypeVar("T")
DatabaseKey = tuple[str, str, tuple[str, ...]]


class SharedDatabase:
    """One open Database, its record locks and its transaction gate."""

    def __init__(self, key: DatabaseKey, db: Database, adapter_thread: Executor,
                 on_deadline: Callback | None = None) -> None:
        self.key = key
        self.name = key[0]
        self.db = db
        self.locks = RecordLocks(on_deadline)
        self.refs = 1
        self._adapter_thread = adapter_thread
        self._gate = threading.Lock()
        self._txn_owner: Hashable | None = None
        self._gate_waiters: collections.deque[tuple[Hashable, Callback]] = collections.deque()

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, an adapter call, on the adapter thread."""
        return self._adapter_thread.submit(fn, *args).result()

    def close(self) -> None:
        self.call(self.db.close)

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


class DatabaseTable:
    """The shared databases by (name, adapter, options)."""

    def __init__(self, on_deadline: Callback | None = None) -> None:
        self._on_deadline = on_deadline  # a record wait got a deadline
        self._mutex = threading.Lock()    # the dict; held briefly (the I/O thread takes it)
        self._opening = threading.Lock()  # one open at a time, so no name opens twice
        self._open: dict[DatabaseKey, SharedDatabase] = {}
        self._adapter_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapters")

    def open(self, name: str, hash_size: int, tdb_flags: int, open_flags: int, mode: int,
             lock_order: int, dbwrap_flags: int, adapter: str, options: Sequence[str]) -> SharedDatabase:
        """A reference to the database; the first open's flags win, as in tdb."""
        key = (name, adapter, tuple(options))
        with self._opening:
            with self._mutex:
                shared = self._open.get(key)
                if shared is not None:
                    shared.refs += 1
                    return shared
            # outside the dict's mutex: an adapter's open may take a network round trip
            db = self._adapter_thread.submit(open_database, name, hash_size, tdb_flags, open_flags,
                                             mode, lock_order, dbwrap_flags, adapter,
                                             list(options)).result()
            with self._mutex:
                shared = self._open[key] = SharedDatabase(key, db, self._adapter_thread,
                                                          self._on_deadline)
            return shared

    def release(self, shared: SharedDatabase) -> None:
        """One reference goes; the last closes the database."""
        with self._mutex:
            shared.refs -= 1
            if shared.refs > 0:
                return
            del self._open[shared.key]
        shared.close()

    def expire(self, now: float) -> float | None:
        """Fail record waits past their deadline; the next deadline, if any."""
        with self._mutex:
            databases = list(self._open.values())
        deadlines = [d for d in (shared.locks.expire(now) for shared in databases) if d is not None]
        return min(deadlines, default=None)

    def close_all(self) -> None:
        with self._mutex:
            databases = list(self._open.values())
            self._open.clear()
        try:
            for shared in databases:
                shared.close()
        finally:
            self._adapter_thread.shutdown(wait=True)
