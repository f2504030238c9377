"""Per-operation latencies through the bridge: `dbwrap-py bench micro`.

build/bench_micro (bench/bench_micro.c) drives one backend through Samba's
real dbwrap front end and prints JSON; this module runs it once per backend
(native tdb first, as the reference), starts the throwaway servers that
networked adapters need, and turns the results into a table, JSON and CSV.

``round_trips()`` is called by bench_micro inside its embedded Python, so
this module imports nothing heavy at the top.
"""

from __future__ import annotations

import csv
import gc
import json
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

NATIVE = "native"
#: the columns of the CSV and the fields of one result
FIELDS = ("backend", "workload", "keys", "mix", "ops", "ops_per_second", "mean_us",
          "p50_us", "p90_us", "p99_us", "max_us", "round_trips_per_op")


def round_trips() -> int:
    """The sum of every live adapter's ``round_trips`` counter, -1 if none keeps one."""
    from dbwrap_py.adapter import Adapter

    counters = [getattr(obj, "round_trips") for obj in gc.get_objects()
                if isinstance(obj, Adapter) and isinstance(getattr(obj, "round_trips", None), int)]
    return sum(counters) if counters else -1


@dataclass
class MicroResult:
    backend: str
    workload: str
    keys: str  # uniform | zipfian
    mix: str
    ops: int
    ops_per_second: float
    mean_us: float
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    round_trips_per_op: float | None  # None: the backend keeps no count

    @property
    def label(self) -> str:
        return f"{self.workload} ({self.keys})" if self.mix else self.workload


def parse_output(text: str) -> list[MicroResult]:
    """bench_micro's JSON, one MicroResult per workload."""
    data = json.loads(text)
    results = []
    for row in data["results"]:
        trips = row.pop("round_trips_per_op")
        results.append(MicroResult(backend=data["backend"], round_trips_per_op=None if trips < 0 else trips,
                                   **row))
    return results


def bench_command(binary: Path, backend: str, options: Mapping[str, str], max_ops: int,
                  seconds: float, keys: int, folder: Path) -> list[str]:
    command = [str(binary), backend, "-n", str(max_ops), "-t", str(seconds), "-k", str(keys),
               "-d", str(folder)]
    for key, value in options.items():
        command += ["-o", f"{key}={value}"]
    return command


def run_backend(binary: Path, backend: str, options: Mapping[str, str], max_ops: int,
                seconds: float, keys: int, timeout: float = 600) -> list[MicroResult]:
    """bench_micro on one backend, its files in a folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="dbwrap_py_micro.") as folder:
        result = subprocess.run(bench_command(binary, backend, options, max_ops, seconds, keys,
                                              Path(folder)),
                                capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"bench_micro {backend} failed ({result.returncode}):\n"
                           f"{result.stderr[-2000:]}")
    return parse_output(result.stdout)


def run(binary: Path, backends: Sequence[str], options: Mapping[str, Mapping[str, str]],
        max_ops: int, seconds: float, keys: int,
        on_backend: Callable[[str], None] = lambda _: None,
        on_error: Callable[[str, str], None] = lambda *_: None) -> list[MicroResult]:
    """Every backend in turn; one that fails is reported and left out."""
    from dbwrap_py.bench.targets import display_name

    results: list[MicroResult] = []
    for backend in backends:
        on_backend(backend)
        given = options.get(backend, {})
        try:
            label = display_name(backend, given)  # e.g. fdb (model): never shown as the real thing
            results += [replace(r, backend=label) for r in
                        run_backend(binary, backend, given, max_ops, seconds, keys)]
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            on_error(backend, str(exc))
    return results


def _cell(result: MicroResult | None) -> str:
    if result is None:
        return "-"
    return f"{result.p50_us:.1f}/{result.p99_us:.1f}"


def table(results: Sequence[MicroResult]) -> list[str]:
    """p50/p99 in microseconds, one row per workload, one column per backend;
    round trips per operation for the backends that count them."""
    backends = list(dict.fromkeys(r.backend for r in results))
    labels = list(dict.fromkeys(r.label for r in results))
    by_key = {(r.backend, r.label): r for r in results}
    width = max([len(label) for label in labels] + [10])
    lines = [f"{'p50/p99 us':<{width}} " + " ".join(f"{b:>16}" for b in backends)]
    for label in labels:
        lines.append(f"{label:<{width}} " + " ".join(f"{_cell(by_key.get((b, label))):>16}"
                                                     for b in backends))
    counted = [b for b in backends if any(r.round_trips_per_op is not None for r in results
                                          if r.backend == b)]
    for backend in counted:
        trips = ", ".join(f"{label} {by_key[(backend, label)].round_trips_per_op:.1f}"
                          for label in labels if (backend, label) in by_key)
        lines.append(f"round trips per operation, {backend}: {trips}")
    uncounted = [b for b in backends if b not in counted]
    if uncounted:
        lines.append(f"round trips per operation: n/a for {', '.join(uncounted)} (no network)")
    return lines


def write_json(path: Path, results: Sequence[MicroResult], settings: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "bench_micro", **settings,
                                "results": [asdict(r) for r in results]}, indent=2) + "\n")


def write_csv(path: Path, results: Sequence[MicroResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for result in results:
            row = asdict(result)
            row["round_trips_per_op"] = "n/a" if result.round_trips_per_op is None \
                else result.round_trips_per_op
            writer.writerow(row)
