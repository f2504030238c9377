"""The conformance table: check, result, the rule it enforces, and the evidence."""

from __future__ import annotations

import textwrap
from typing import TextIO

from dbwrap_py.adapter import Capabilities
from dbwrap_py.conformance.runner import SuiteRun

_WORD = {"pass": "pass", "fail": "FAIL", "skip": "skip"}


def describe(caps: Capabilities | None) -> str:
    if caps is None:
        return "Samba's native tdb (the reference)"
    limit = f"{caps.max_value_size} bytes" if caps.max_value_size else "none declared"
    return (f"transactions {'yes' if caps.transactions else 'no'}, "
            f"multi-process {'yes' if caps.multi_process else 'no'}, "
            f"lock release {caps.lock_release_seconds:g} s, max value {limit}")


def print_table(run: SuiteRun, out: TextIO, rules: bool = True) -> None:
    print(f"dbwrap_py conformance: {run.target}", file=out)
    print(f"  declares: {describe(run.capabilities)}", file=out)
    if run.capabilities is not None:
        for note in run.capabilities.notes:
            print(f"  note: {note}", file=out)
    width = max([24, *(len(r.name) + 2 for r in run.results)])  # persistent.other-process is 24
    print(f"\n{'check':<{width}}{'result':<8}{'rule' if rules else 'measured'}", file=out)
    for r in run.results:
        third = r.rule if rules else r.measured
        print(f"{r.name:<{width}}{_WORD[r.result]:<8}{third}", file=out)
        detail = r.note if r.result != "pass" else (r.measured if rules else "")
        if detail:
            label = {"fail": "evidence", "skip": "reason", "pass": "measured"}[r.result]
            for line in textwrap.wrap(f"{label}: {detail}", 96):
                print(f"{'':<{width + 8}}{line}", file=out)
    passed, failed, skipped = (len(run.names(w)) for w in ("pass", "fail", "skip"))
    if failed:
        verdict = "NOT safe for Samba: see the failed checks"
    elif passed:
        verdict = "Samba's dbwrap contract holds on it, as far as these checks go"
    else:
        verdict = "nothing was checked: see the reasons"
    print(f"\n{passed} passed, {failed} failed, {skipped} skipped: {verdict}", file=out)
