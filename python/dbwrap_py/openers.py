"""Who has a database open: TDB_CLEAR_IF_FIRST's openers, the generic half.

A store that wipes a volatile database at its first open keeps a
registration per opener that lives only while its opener does: a row or key
with a TTL that the opener renews. The store supplies the primitives for one
database (``OpenerStore``); this service owns the rest, once for every
adapter:

* the open: under the store's own atomicity (``exclusive``), is anyone else
  registered; if not and the database was opened with TDB_CLEAR_IF_FIRST,
  the store wipes it (``opened(first=True)``); then this opener registers.
  A store that does the test, the wipe and the registration in one atomic
  step of its own (etcd's transaction) says so with ``open_atomically``
  instead (``AtomicOpenerStore``);
* this process's registry of registrations, and one renewal thread for all
  of them: each is renewed every ``RENEW_FRACTION`` of its store's ``ttl``;
  a failed renewal is logged (the first of a run of failures as a warning,
  the recovery too), never raised, and tried again sooner, as
  ``dbwrap_py.retry``'s backoff says, never later than the next renewal
  would be. Each try is bounded by the store's own operation timeout. The
  thread ends when the process has no registration left;
* a fork: the child drops its parent's registrations and the parent's
  thread is not in it (the parent's registrations are the parent's, which
  goes on renewing them and removes them on close); the child's own, if it
  opens databases, are renewed by a thread of its own;
* the close: ``leave`` removes the registration from the store; a parent's
  registration left in a child is not the child's to remove.

A killed opener counts as open until its registration expires.

A registration may cover its process's forked children
(``covers_children``): they are openers through it and never register
themselves, as tdb covers smbd's children (``tdb_reopen_all(parent_longlived)``
takes no CLEAR_IF_FIRST lock in them: the long-lived parent is the opener).
Adapters ask for it where a node agent serves the database's node cache
(``DatabaseSpec.node``): the children then need no lease, no renewal and no
round trip to open, so the store's work grows with smbd's parents, one a
node, not with its processes. A child outliving its parent is then not
counted, as in tdb.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from dbwrap_py.retry import Backoff

#: a registration is renewed every RENEW_FRACTION of its ttl
RENEW_FRACTION = 1 / 3
#: a failed renewal is tried again after a backoff starting at this fraction of the renewal interval
RETRY_FRACTION = 1 / 10

LOG = logging.getLogger("dbwrap_py.openers")


class OpenerStore(Protocol):
    """One database's openers in one store: what the service asks of it."""

    #: seconds a registration lives unless renewed; None: the store keeps it
    #: alive itself (the service never renews it)
    ttl: float | None

    def exclusive(self) -> AbstractContextManager[None]:
        """The store's own lock over opening the database: while it is
        held, no other opener tests, wipes or registers."""

    def others_open(self) -> bool:
        """Is anyone registered (a live registration), under ``exclusive``?"""

    def opened(self, first: bool) -> None:
        """The store's work at the open, under ``exclusive``; ``first``:
        TDB_CLEAR_IF_FIRST and nobody else open, wipe the database."""

    def register(self, opener: int) -> None:
        """Add or renew ``opener``'s registration (for ``ttl``); raise on failure."""

    def unregister(self, opener: int) -> None:
        """Remove ``opener``'s registration; raise on failure (it expires by itself)."""


@runtime_checkable
class AtomicOpenerStore(Protocol):
    """A store whose open is one atomic step: no ``exclusive`` lock needed."""

    ttl: float | None

    def open_atomically(self, opener: int, clear_if_first: bool) -> bool:
        """Register ``opener``; in the same atomic step, if nobody else is
        registered and ``clear_if_first``, wipe the database. Whether it wiped."""

    def register(self, opener: int) -> None:
        """Renew ``opener``'s registration (for ``ttl``); raise on failure."""

    def unregister(self, opener: int) -> None:
        """Remove ``opener``'s registration; raise on failure (it expires by itself)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Registration:
    """One opener of one database, registered by the process ``pid``."""

    store: OpenerStore | AtomicOpenerStore
    opener: int
    pid: int
    #: this open was the first: it wiped the database (TDB_CLEAR_IF_FIRST)
    first: bool = False
    #: the process's forked children are openers through this registration
    covers_children: bool = False

    def covers_child(self) -> bool:
        """In a forked child: is it an opener through this registration of
        its parent's (then it must not register again), or must it join anew?"""
        return self.covers_children and self.pid != os.getpid()


@dataclasses.dataclass
class _Renewal:
    """When a registration is due, and how many renewals in a row failed."""

    due: float
    failures: int = 0


class _ProcessState:
    """One process's registrations and its renewal thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.changed = threading.Condition(threading.Lock())
        self.renewals: dict[Registration, _Renewal] = {}
        self.thread: threading.Thread | None = None


class Openers:
    """The openers service: one per process (``OPENERS``) in production;
    tests make their own with a clock of their choosing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, name: str = "dbwrap-py openers") -> None:
        self._clock = clock
        self._name = name
        self._state = _ProcessState()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget(ref))

    # -- what adapters call ---------------------------------------------------

    def open(self, store: OpenerStore | AtomicOpenerStore, clear_if_first: bool,
             covers_children: bool = False) -> Registration:
        """Join the database's openers; the first one wipes it if
        ``clear_if_first``. ``covers_children``: this process's forked
        children are openers through this registration (see the module)."""
        if isinstance(store, AtomicOpenerStore):
            opener = secrets.randbits(63)
            first = store.open_atomically(opener, clear_if_first)
            return self._keep(Registration(store, opener, os.getpid(), first, covers_children))
        with store.exclusive():
            first = clear_if_first and not store.others_open()
            store.opened(first)
            return self.join(store, first, covers_children)

    def join(self, store: OpenerStore, first: bool = False, covers_children: bool = False) -> Registration:
        """Register a new opener of ``store``'s database and keep it renewed."""
        registration = Registration(store, secrets.randbits(63), os.getpid(), first, covers_children)
        store.register(registration.opener)
        return self._keep(registration)

    def _keep(self, registration: Registration) -> Registration:
        """Renew a registered opener every RENEW_FRACTION of its store's ttl (if it has one)."""
        store = registration.store
        if store.ttl is None:
            return registration
        state = self._mine()
        with state.changed:
            state.renewals[registration] = _Renewal(self._next(store.ttl))
            if state.thread is None:
                state.thread = threading.Thread(target=self._renew, args=(state,), name=self._name, daemon=True)
                state.thread.start()
            state.changed.notify()
        return registration

    def leave(self, registration: Registration) -> None:
        """Stop renewing it and remove it from the store; errors are logged
        (the registration expires by itself). A parent's, in a child: left alone."""
        if registration.pid != os.getpid():
            return
        state = self._mine()
        with state.changed:
            state.renewals.pop(registration, None)
            state.changed.notify()
        try:
            registration.store.unregister(registration.opener)
        except Exception as exc:  # noqa: BLE001 - any store error: the registration expires
            LOG.info("openers: leaving %r failed, left to expire: %s: %s", registration.store,
                     type(exc).__name__, exc)

    def registrations(self) -> list[Registration]:
        """This process's registrations being renewed."""
        state = self._mine()
        with state.changed:
            return list(state.renewals)

    def renewal_thread(self) -> threading.Thread | None:
        """This process's renewal thread, while it has registrations (tests, diagnostics)."""
        return self._mine().thread

    def after_fork_in_child(self) -> None:
        """The parent's registrations and thread are the parent's."""
        self._state = _ProcessState()

    # -- the renewal thread -----------------------------------------------------

    def _mine(self) -> _ProcessState:
        state = self._state
        if state.pid != os.getpid():  # a fork the at-fork hook did not see
            state = self._state = _ProcessState()
        return state

    def _next(self, ttl: float) -> float:
        return self._clock() + ttl * RENEW_FRACTION

    def _renew(self, state: _ProcessState) -> None:
        while True:
            with state.changed:
                due = self._wait_for_due(state)
                if due is None:
                    state.thread = None
                    return
            for registration in due:
                self._renew_one(state, registration)

    def _wait_for_due(self, state: _ProcessState) -> list[Registration] | None:
        """The registrations due now, waiting until one is; None: none left."""
        while state.renewals:
            now = self._clock()
            due = [r for r, renewal in state.renewals.items() if renewal.due <= now]
            if due:
                return due
            state.changed.wait(min(renewal.due for renewal in state.renewals.values()) - now)
        return None

    def _renew_one(self, state: _ProcessState, registration: Registration) -> None:
        ttl = registration.store.ttl or 0.0
        try:
            registration.store.register(registration.opener)
        except Exception as exc:  # noqa: BLE001 - any store error: logged, tried again
            self._failed(state, registration, ttl, exc)
            return
        with state.changed:
            renewal = state.renewals.get(registration)
            if renewal is None:
                return  # left meanwhile
            if renewal.failures:
                LOG.warning("openers: renewing %r works again after %d failures", registration.store,
                            renewal.failures)
            renewal.failures, renewal.due = 0, self._next(ttl)

    def _failed(self, state: _ProcessState, registration: Registration, ttl: float, exc: Exception) -> None:
        with state.changed:
            renewal = state.renewals.get(registration)
            if renewal is None:
                return
            renewal.failures += 1
            interval = ttl * RENEW_FRACTION
            backoff = Backoff(first=interval * RETRY_FRACTION, cap=interval)
            renewal.due = self._clock() + backoff.pause(renewal.failures, random.random())
            failures = renewal.failures
        log = LOG.warning if failures == 1 else LOG.debug
        log("openers: renewing %r failed (%d in a row), tried again: %s: %s", registration.store, failures,
            type(exc).__name__, exc)


def _forget(ref: "weakref.ref[Openers]") -> None:
    openers = ref()
    if openers is not None:
        openers.after_fork_in_child()


#: this process's openers service
OPENERS = Openers()
