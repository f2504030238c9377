"""Throwaway servers for tests and benchmarks: each starts a backend on
127.0.0.1 (or in namespaces the run makes) with temporary data, and stops
it by PID. No runtime module imports them: the framework finds an
adapter's through its test hooks (dbwrap_py.testing.hooks, the
``dbwrap_py.testing`` entry points)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path


def log_tails(files: Iterable[tuple[str | None, Path]], lines: int,
              noise: Callable[[str], bool] = lambda line: False) -> str:
    """The last ``lines`` non-blank lines of each file (label, path), each
    under a header naming it (none for a label of None); files missing or
    empty, and lines ``noise`` picks, left out. What a failed start or test
    prints of a server's logs."""
    out: list[str] = []
    for label, path in files:
        try:
            text = [line for line in path.read_text(errors="replace").splitlines()
                    if line.strip() and not noise(line)][-lines:]
        except OSError:
            continue
        if text:
            out += ([f"--- {label} ({path}) ---"] if label is not None else []) + text
    return "\n".join(out)
