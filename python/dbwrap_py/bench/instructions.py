"""Instructions per dbwrap call, counted by callgrind on build/bench_bridge.

Wall time moves with the machine's load; instruction counts do not (with
a fixed hash seed and no address randomization they repeat exactly), so the
bridge's per-call cost is compared in instructions. Each backend runs in a
process of its own under ``valgrind --tool=callgrind``; the inclusive cost
of each of bench_bridge's per-operation functions (and of Samba's
``dbwrap_fetch_locked`` alone) is divided by the calls it made.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dbwrap_py.options import shown_value

#: bench_bridge's backends, in its order
BACKENDS = ("native-tdb", "bridge+tdb", "bridge+tdb-py", "bridge+memory")
#: row label -> the function whose inclusive cost is counted
OPERATIONS = {
    "parse_record (hit)": "op_parse",
    "dbwrap_store": "op_store",
    "do_locked + storev (3 buffers)": "op_do_locked_3buf",
    "fetch_locked (without the store and free)": "dbwrap_fetch_locked",
}
_LINE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+\S*:(\w+)\s")


class InstructionsError(RuntimeError):
    """valgrind is missing, or a run failed; the message carries its output."""


def calls(iterations: int) -> int:
    """bench_bridge runs each operation iterations/10 times to warm up, then iterations."""
    return iterations + iterations // 10


def inclusive_costs(annotated: str) -> dict[str, int]:
    """function name -> inclusive instructions, from callgrind_annotate --inclusive=yes."""
    costs: dict[str, int] = {}
    for line in annotated.splitlines():
        match = _LINE.match(line)
        if match:
            costs.setdefault(match.group(2), int(match.group(1).replace(",", "")))
    return costs


def count(binary: Path, backend: str, iterations: int,
          env: dict[str, str] | None = None) -> dict[str, float]:
    """Instructions per call of each operation on one backend."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise InstructionsError("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="dbwrap_py_callgrind.") as tmp:
        out = Path(tmp) / "callgrind.out"
        # A fixed hash seed and no address randomization: the Python path's
        # dict probing then repeats, and so does the count, to the instruction.
        env = dict(os.environ, PYTHONHASHSEED="0", **(env or {}))
        run = subprocess.run(
            ["setarch", platform.machine(), "-R", "valgrind", "--tool=callgrind",
             f"--callgrind-out-file={out}", str(binary), str(iterations), "-", backend],
            capture_output=True, text=True, timeout=1800, env=env)
        if run.returncode != 0 or not out.exists():
            raise InstructionsError(f"callgrind on {backend} failed ({run.returncode}):\n"
                                    + "\n".join(run.stderr.splitlines()[-20:]))
        annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                                    str(out)],
                                   capture_output=True, text=True, check=True).stdout
    costs = inclusive_costs(annotated)
    missing = [f for f in OPERATIONS.values() if f not in costs]
    if missing:
        raise InstructionsError(f"callgrind_annotate listed no {', '.join(missing)} for {backend}")
    n = calls(iterations)
    return {label: costs[function] / n for label, function in OPERATIONS.items()}


def measure(binary: Path, backends: Sequence[str] = BACKENDS, iterations: int = 2000,
            extra: tuple[str, dict[str, str]] | None = None) -> dict[str, dict[str, float]]:
    """Each backend; ``extra`` adds an adapter with options (its throwaway
    server, and node agent, started for it) as bench_bridge's bridge+extra."""
    results = {backend: count(binary, backend, iterations) for backend in backends}
    if extra is not None:
        from dbwrap_py.servers import backend_options

        adapter, options = extra
        with backend_options(adapter, options) as reach:
            env = {"DBWRAP_PY_BENCH_ADAPTER": adapter,
                   "DBWRAP_PY_BENCH_OPTIONS": ",".join(f"{k}={v}" for k, v in reach.items())}
            label = f"bridge+{adapter}" + "".join(f" {k}={shown_value(k, v)}" for k, v in options.items())
            results[label] = count(binary, "bridge+extra", iterations, env)
    return results


def table_lines(results: dict[str, dict[str, float]]) -> list[str]:
    backends = list(results)
    lines = [f"{'instructions per call':44}" + "".join(f"{b:>15}" for b in backends)]
    for label in OPERATIONS:
        lines.append(f"{label:44}" + "".join(
            f"{results[b][label] / 1000:>14.2f}k" for b in backends))
    return lines
