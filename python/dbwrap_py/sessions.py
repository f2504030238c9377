"""This process's clients of a store, one per configuration.

An adapter whose driver keeps connections and threads (a Cassandra
``Cluster``, say) makes one client per process per configuration and shares
it between the databases that process opens::

    _CLIENTS: Sessions[Driver] = Sessions("cassandra")
    ...
    driver = _CLIENTS.client_for(config, lambda: Driver(config))

A forked child never uses its parent's clients: the driver's threads are not
in the child, so a request on an inherited connection could wait forever.
After a fork the parent's clients are dropped in the child, not closed (they
are the parent's, which goes on using them), and the child's are made on
demand. The registry tells a child by its pid, and a fork also gives the
child a new lock: a parent's thread may have held the old one across
``fork()``, and it is not in the child to let it go.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _ProcessState(Generic[T]):
    """What one process holds: its pid, its lock and its clients."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.clients: dict[Hashable, T] = {}


class Sessions(Generic[T]):
    """A per-process registry of clients, keyed by configuration."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._state: _ProcessState[T] = _ProcessState()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget(ref))

    def _mine(self) -> _ProcessState[T]:
        """This process's state; a parent's is dropped unused (also without
        the at-fork hook, as after a fork outside Python's os.fork)."""
        state = self._state
        if state.pid != os.getpid():
            state = self._state = _ProcessState()
        return state

    def client_for(self, key: Hashable, factory: Callable[[], T]) -> T:
        """This process's client for ``key``, made by ``factory`` on first use.
        A factory's exception propagates and nothing is kept."""
        state = self._mine()
        with state.lock:
            found = state.clients.get(key)
            if found is None:
                found = state.clients[key] = factory()
            return found

    def clients(self) -> list[T]:
        """This process's clients (a parent's are not)."""
        state = self._mine()
        with state.lock:
            return list(state.clients.values())

    def close_all(self, close: Callable[[T], None]) -> None:
        """Forget this process's clients, ``close`` called on each (tests;
        smbd's processes just exit)."""
        state = self._mine()
        with state.lock:
            found, state.clients = list(state.clients.values()), {}
        for client in found:
            close(client)

    def after_fork_in_child(self) -> None:
        """Drop the parent's clients and lock (they are the parent's)."""
        self._state = _ProcessState()


def _forget(ref: "weakref.ref[Sessions[T]]") -> None:
    sessions = ref()
    if sessions is not None:
        sessions.after_fork_in_child()
