"""Run a function in a forked child and get its JSON-able result back: for
tests of what a process sees after fork (never returns into pytest there)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def in_forked_child(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """``fn`` fills a dict in a forked child; the dict as the parent gets it.
    An exception in ``fn`` ends up in the dict as ``"raised"``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        result: dict[str, Any] = {}
        try:
            os.close(read)
            fn(result)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result["raised"] = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write, json.dumps(result).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text)
