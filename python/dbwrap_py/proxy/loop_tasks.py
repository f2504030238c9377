"""The daemon's I/O loop thread as an executor: its adapter thread.

Requests, their adapter calls and their replies all run on the thread that
also selects on the sockets, between two selects. The hand-offs between
threads cost more than a tdb request's own work (without them a tdb fetch
took 65 us instead of 203); and adapter calls were on one thread already (shared.py says why), so a
second thread bought nothing but the hand-off: while an adapter call
blocks, the requests that arrive meanwhile would have waited for that
thread anyway.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from dbwrap_py.proxy.log import log


class LoopTasks(Executor):
    """Tasks submitted from any thread, run in order by ``run_pending`` on
    the loop's thread; ``wake`` makes a select in progress return."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._tasks: collections.deque[tuple[Future[Any], Callable[..., Any], tuple, dict]] = (
            collections.deque())
        self._loop_thread: int | None = None
        self._shut = False

    def bind_to_this_thread(self) -> None:
        """The calling thread is the loop's from now on."""
        self._loop_thread = threading.get_ident()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._shut:
            raise RuntimeError("the daemon's loop has ended")
        future: Future[Any] = Future()
        self._tasks.append((future, fn, args, kwargs))  # deque.append: safe from any thread
        if not self.on_loop_thread():
            self._wake()
        return future

    def post(self, task: Callable[[], None]) -> None:
        """A connection's task, run in order with every other (so its state
        needs no lock); an exception is a bug of ours, logged, and the loop
        goes on. After the loop has ended it runs at once."""
        def logged() -> None:
            try:
                task()
            except Exception as exc:
                log(f"internal error in a connection's task: {type(exc).__name__}: {exc}")
        if self._shut:
            logged()
        else:
            self.submit(logged)

    def pending(self) -> bool:
        return bool(self._tasks)

    def run_pending(self) -> None:
        """Run the tasks queued so far (those they queue run next turn, so
        the sockets are looked at in between)."""
        for _ in range(len(self._tasks)):
            future, fn, args, kwargs = self._tasks.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as exc:  # the submitter's to see
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Run what is left, then refuse more (on the loop's thread only)."""
        while self._tasks:
            self.run_pending()
        self._shut = True
