"""Which connection holds which record of one database, and who waits.

The daemon is one process, so the adapter's locks and Database's hold
counts cannot tell its connections apart: without this table two
connections would both "hold" one record. The table is the daemon's one
owner of record exclusion between connections; the adapter's own lock is
taken by the connection's first hold and given back with its last (the
caller does that, see session.py), so other processes and nodes are still
kept out by the adapter.

A wait never blocks a thread: the waiter is parked with two callbacks, and
exactly one of them runs later, ``granted`` when the record is handed to it
or ``expired`` at its deadline. Callbacks run outside the table's mutex and
must be quick (they queue work; they do not do it).
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from dbwrap_py.proxy.wire import WAIT_FOREVER


Callback = Callable[[], None]


class Outcome(enum.Enum):
    HELD = "held"      # granted at once (the hold is counted)
    PARKED = "parked"  # one of the callbacks runs later
    BUSY = "busy"      # held by another and no wait was allowed


@dataclass(eq=False)
class _Waiter:
    owner: Hashable
    key: bytes
    granted: Callback
    expired: Callback
    deadline: float | None
    done: bool = False


@dataclass(eq=False)
class _Record:
    key: bytes
    owner: Hashable
    holds: int
    waiters: collections.deque[_Waiter] = field(default_factory=collections.deque)


def deadline_of(wait_ms: int) -> float | None:
    """The monotonic deadline of a LOCK's ``wait_ms``; None waits forever."""
    return None if wait_ms == WAIT_FOREVER else time.monotonic() + wait_ms / 1000


class RecordLocks:
    """Record holds by owner (a connection), counted so holds nest."""

    def __init__(self, on_deadline: Callback | None = None) -> None:
        #: told of each new deadline, so the daemon's loop wakes to expire it
        self._on_deadline = on_deadline
        self._mutex = threading.Lock()
        self._records: dict[bytes, _Record] = {}
        self._by_owner: dict[Hashable, set[bytes]] = {}
        self._waiting: dict[Hashable, list[_Waiter]] = {}
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()

    def acquire(self, owner: Hashable, key: bytes, granted: Callback, expired: Callback,
                deadline: float | None) -> Outcome:
        """Hold ``key`` for ``owner`` now, or park until it is handed over."""
        with self._mutex:
            record = self._records.get(key)
            if record is None:
                self._hold(owner, key, 1)
                return Outcome.HELD
            if record.owner == owner:
                record.holds += 1
                return Outcome.HELD
            if deadline is not None and deadline <= time.monotonic():
                return Outcome.BUSY
            waiter = _Waiter(owner, key, granted, expired, deadline)
            record.waiters.append(waiter)
            self._waiting.setdefault(owner, []).append(waiter)
            if deadline is None:
                return Outcome.PARKED
            heapq.heappush(self._deadlines, (deadline, next(self._order), waiter))
        if self._on_deadline is not None:
            self._on_deadline()
        return Outcome.PARKED

    def holds(self, owner: Hashable, key: bytes) -> int:
        with self._mutex:
            record = self._records.get(key)
            return record.holds if record is not None and record.owner == owner else 0

    def any_held(self) -> bool:
        with self._mutex:
            return bool(self._records)

    def held_by(self, owner: Hashable) -> list[bytes]:
        with self._mutex:
            return sorted(self._by_owner.get(owner, ()))

    def release(self, owner: Hashable, key: bytes, every_hold: bool = False) -> None:
        """One hold of ``owner`` goes (all of them with ``every_hold``); with
        the last, the record passes to its next waiter. Not held: nothing."""
        with self._mutex:
            record = self._records.get(key)
            if record is None or record.owner != owner:
                return
            record.holds = 0 if every_hold else record.holds - 1
            if record.holds > 0:
                return
            self._by_owner[owner].discard(key)
            if not self._by_owner[owner]:
                del self._by_owner[owner]
            waiter = self._hand_over(record)
        if waiter is not None:
            waiter.granted()

    def forget(self, owner: Hashable) -> None:
        """``owner``'s parked waits end without a callback (it went away)."""
        with self._mutex:
            for waiter in self._waiting.pop(owner, ()):
                waiter.done = True
                record = self._records.get(waiter.key)
                if record is not None:
                    record.waiters.remove(waiter)

    def expire(self, now: float) -> float | None:
        """Fail the waits past their deadline; the next deadline, if any."""
        due: list[_Waiter] = []
        with self._mutex:
            while self._deadlines and (self._deadlines[0][2].done or self._deadlines[0][0] <= now):
                waiter = heapq.heappop(self._deadlines)[2]
                if not waiter.done:
                    self._end_wait(waiter)
                    self._records[waiter.key].waiters.remove(waiter)
                    due.append(waiter)
            following = self._deadlines[0][0] if self._deadlines else None
        for waiter in due:
            waiter.expired()
        return following

    # -- under the mutex ------------------------------------------------------

    def _hold(self, owner: Hashable, key: bytes, holds: int) -> None:
        self._records[key] = _Record(key, owner, holds)
        self._by_owner.setdefault(owner, set()).add(key)

    def _end_wait(self, waiter: _Waiter) -> None:
        waiter.done = True
        mine = self._waiting.get(waiter.owner, [])
        mine.remove(waiter)
        if not mine:
            self._waiting.pop(waiter.owner, None)

    def _hand_over(self, record: _Record) -> _Waiter | None:
        if not record.waiters:
            del self._records[record.key]
            return None
        waiter = record.waiters.popleft()
        self._end_wait(waiter)
        record.owner, record.holds = waiter.owner, 1
        self._by_owner.setdefault(waiter.owner, set()).add(record.key)
        return waiter
