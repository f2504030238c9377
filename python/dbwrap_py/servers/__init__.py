"""Throwaway backend servers for tests and benchmarks.

Each server binds to 127.0.0.1 only, keeps its data in a temporary directory,
and is stopped by PID (never by name) when its context manager exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TypeVar

from dbwrap_py.registry import find_adapter

_PR_SET_PDEATHSIG = 1
_Reach = TypeVar("_Reach")
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: servers just outlive a crashed parent
    _prctl = None


class ServerError(RuntimeError):
    """A throwaway server could not be started (not installed, no port, ...)."""


def die_with_parent() -> None:
    """A throwaway server's preexec_fn (between fork and exec): it gets
    SIGKILL when its starter dies, so an interrupted run leaves none behind."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@contextlib.contextmanager
def backend_options(adapter: str, options: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """``options``, plus a throwaway server's endpoint when the adapter can
    start one and ``options`` name none; the server stops on exit."""
    server = find_adapter(adapter).throwaway_server(options)
    if server is None:
        yield dict(options)
        return
    with server as server_options:
        yield {**options, **server_options}


def serve_until_stopped(server: AbstractContextManager[_Reach],
                        banner: Callable[[_Reach], str]) -> None:
    """Start ``server``, print ``banner`` of what it gives, and keep it up
    until SIGTERM or Ctrl-C; on the way out it stops and removes its data."""

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        with server as reach:
            print(f"{banner(reach)}\nSIGTERM or Ctrl-C stops it and removes its data", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    finally:
        signal.signal(signal.SIGTERM, previous)
