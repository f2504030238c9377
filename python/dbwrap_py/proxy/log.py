"""The daemon's one-line log, on stderr."""

from __future__ import annotations

import os
import sys


def log(text: str) -> None:
    print(f"proxy-daemon[{os.getpid()}]: {text}", file=sys.stderr, flush=True)
