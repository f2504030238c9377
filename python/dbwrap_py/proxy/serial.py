"""Work for one connection, run in order on a shared executor (the daemon's adapter thread)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Executor

from dbwrap_py.proxy.log import log


class SerialQueue:
    """Tasks that never overlap, on any of the pool's threads.

    A connection's request, the resumption of its parked wait and its
    cleanup all touch its state; queueing them here means that state needs
    no lock of its own, and no thread is tied to an idle connection.
    """

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        self._mutex = threading.Lock()
        self._running = False

    def submit(self, task: Callable[[], None]) -> None:
        with self._mutex:
            self._tasks.append(task)
            if self._running:
                return
            self._running = True
        try:
            self._pool.submit(self._drain)
        except RuntimeError:  # the pool is shut down: run it here
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._mutex:
                if not self._tasks:
                    self._running = False
                    return
                task = self._tasks.popleft()
            try:
                task()
            except Exception as exc:  # a bug of ours must not stop the queue
                log(f"internal error in a connection's task: {type(exc).__name__}: {exc}")
