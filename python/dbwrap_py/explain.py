"""Why a run against a throwaway Samba failed, from smbd's log and smbtorture's output.

A benchmark or the demo that fails prints these lines rather than a bare
"failed": smbd's errors (the messages it logs at debug level 0, and every
line of the bridge's), then what smbtorture said about the failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# "[2026/11/23 04:32:54.059115,  0] ../../lib/util/modules.c:49(load_module)"
_LOG_HEADER = re.compile(r"^\[\d{4}/\d\d/\d\d [\d:.]+,\s*(\d+)[^\]]*\]\s*(\S*)")
#: level-0 messages that say nothing about a failure
_ROUTINE = ("smbd version", "Copyright Andrew Tridgell")
_TORTURE_PROBLEM = re.compile(r"NT_STATUS_\w+|failed|failure|error|refused|timed out", re.I)


def _log_entries(text: str) -> Iterable[tuple[int, str]]:
    """(debug level, message) for each entry of a Samba log."""
    level, message = -1, []
    for line in text.splitlines():
        header = _LOG_HEADER.match(line)
        if header:
            if message:
                yield level, " ".join(message)
            level, message = int(header.group(1)), []
        elif line.strip():
            message.append(line.strip())
    if message:
        yield level, " ".join(message)


def smbd_problems(log_text: str, limit: int = 6) -> list[str]:
    """smbd's errors: level-0 messages and the bridge's lines, oldest first,
    repeats dropped, at most ``limit`` (the first ones: the cause comes
    before its consequences)."""
    seen: list[str] = []
    for level, message in _log_entries(log_text):
        if level != 0 and "dbwrap_py:" not in message:
            continue
        if message.startswith(_ROUTINE) or message in seen:
            continue
        seen.append(message)
    return seen[:limit]


def torture_problems(output: str, limit: int = 6) -> list[str]:
    """smbtorture's lines about a failure: the failure or error record and
    any line naming an NTSTATUS or saying something failed."""
    lines: list[str] = []
    for line in output.splitlines():
        text = line.strip()
        if text in ("[", "]") or not _TORTURE_PROBLEM.search(text) or text in lines:
            continue
        lines.append(text)
    return lines[:limit]


def explain(torture_output: str, smbd_log: str) -> list[str]:
    """The cause of a failed smbtorture run, smbd's side first; never empty."""
    lines = [f"smbd: {m}" for m in smbd_problems(smbd_log)]
    lines += [f"smbtorture: {t}" for t in torture_problems(torture_output)]
    if not lines:
        tail = [t for t in torture_output.strip().splitlines()[-3:] if t.strip()]
        lines = [f"smbtorture: {t}" for t in tail] or \
            ["smbtorture printed nothing and smbd logged no error"]
    return lines
