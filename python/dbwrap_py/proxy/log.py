"""The daemon's one-line log, on stderr; and its request counts' line."""

from __future__ import annotations

import os
import re
import sys

from dbwrap_py.proxy.wire import Op

_COUNTS = "requests by op:"


def log(text: str) -> None:
    print(f"proxy-daemon[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def op_name(raw: int) -> str:
    """An op byte's name (a malformed request's: op<N>)."""
    try:
        return Op(raw).name
    except ValueError:
        return f"op{raw}"


def log_request_counts(counts: dict[int, int]) -> None:
    """The requests the daemon took in (each answered, or the connection
    hung up on), by op: its last line as it stops."""
    log(f"{_COUNTS} " + (" ".join(f"{op_name(op)}={n}" for op, n in sorted(counts.items())) or "none"))


def request_counts(log_text: str) -> dict[str, int]:
    """The counts of the last such line in a daemon's log, by op name."""
    lines = [line for line in log_text.splitlines() if _COUNTS in line]
    if not lines:
        raise ValueError("no request counts in the log: the daemon has not stopped (SIGTERM)")
    return {op: int(n) for op, n in re.findall(r"(\w+)=(\d+)", lines[-1].split(_COUNTS, 1)[1])}
