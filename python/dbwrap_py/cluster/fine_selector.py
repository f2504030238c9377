"""An epoll selector whose waits end to the microsecond, for the TCP relay.

epoll_wait takes its timeout in whole milliseconds, and Python rounds a
finer one up, so an asyncio loop on the default selector sleeps at least
1 ms for any timer: a relay holding chunks 0.1 ms would hold them 1 ms.
``FineSelector`` arms a timerfd (CLOCK_MONOTONIC, nanoseconds) for every
finite wait and has epoll watch it too; the timer ends the wait when it is
due, the millisecond timeout is only a backstop. The timer's expiry count
is read after every wait, so it never stays readable.

Python 3.11 has no ``os.timerfd_create`` (3.13 does), so the two calls go
through ctypes to the C library.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import select
import selectors
from typing import Any

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC
_NS = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.POINTER(_Itimerspec))


def _checked(result: int, call: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}")
    return result


class FineSelector(selectors.EpollSelector):
    """EpollSelector whose ``select(timeout)`` returns at ``timeout`` to the
    microsecond when nothing is ready before (the timer's own wake-up is not
    reported)."""

    def __init__(self) -> None:
        super().__init__()
        self._timer = _checked(_libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC),
                               "timerfd_create")
        self._selector.register(self._timer, select.EPOLLIN)  # no key: select() leaves it out

    def _arm(self, seconds: float) -> None:
        ns = max(int(seconds * _NS), 1)  # 0 would disarm it
        value = _Itimerspec(_Timespec(0, 0), _Timespec(ns // _NS, ns % _NS))
        _checked(_libc.timerfd_settime(self._timer, 0, ctypes.byref(value), None), "timerfd_settime")

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            self._arm(timeout)
        try:
            return super().select(timeout)
        finally:
            try:
                os.read(self._timer, 8)
            except BlockingIOError:  # not expired (or already read)
                pass

    def close(self) -> None:
        if self._timer >= 0:
            os.close(self._timer)
            self._timer = -1
        super().close()


def fine_loop() -> asyncio.AbstractEventLoop:
    """An asyncio event loop on a ``FineSelector`` (``asyncio.Runner``'s
    ``loop_factory``)."""
    return asyncio.SelectorEventLoop(FineSelector())


def run(main: Any) -> Any:
    """``asyncio.run(main)`` on a fine loop."""
    with asyncio.Runner(loop_factory=fine_loop) as runner:
        return runner.run(main)
