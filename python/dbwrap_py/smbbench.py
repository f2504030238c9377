"""SMB-level benchmark: path-contention-shared, native tdb against the bridge.

Both Sambas run at once and the measurements alternate (native, bridge) at
each point, so the load of this shared machine drifts over both alike. Only
ratios taken in the same run mean anything.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dbwrap_py.samba import ThrowawaySamba
from dbwrap_py.smbtorture import Rates, path_contention, setup_for


@dataclass
class Point:
    mode: str
    nprocs: int
    opens_per_second: float
    closes_per_second: float
    open_latency_ms: float
    close_latency_ms: float
    ok: bool


def _point(mode: str, nprocs: int, rates: Rates) -> Point:
    def mean(xs: list[float]) -> float:
        xs = xs[1:] if len(xs) > 2 else xs
        return 1000 * sum(xs) / len(xs) if xs else 0.0

    return Point(mode, nprocs, rates.opens_per_second, rates.closes_per_second,
                 mean(rates.open_latency), mean(rates.close_latency), rates.ok)


def run(nprocs: Sequence[int], seconds: int, adapter: str = "tdb",
        rounds: int = 1, say=print) -> list[Point]:
    """Every nprocs point, native then bridge, `rounds` times each."""
    points: list[Point] = []
    with ThrowawaySamba(setup_for("native")) as native, \
            ThrowawaySamba(setup_for("bridge", adapter)) as bridge:
        for n in nprocs:
            for _ in range(rounds):
                for mode, samba in (("native", native), (f"bridge+{adapter}", bridge)):
                    point = _point(mode, n, path_contention(samba, n, seconds))
                    points.append(point)
                    say(f"  nprocs={n:<3} {mode:<14} {point.opens_per_second:9.0f} opens/s"
                        f" {point.closes_per_second:9.0f} closes/s"
                        f"{'' if point.ok else '  (smbtorture reported a failure)'}")
    return points


def summary(points: Sequence[Point]) -> list[dict]:
    """Per nprocs: median opens/s of each mode, and the median and range of
    the ratios of each (native, bridge) pair measured one after the other;
    pairs share the machine's load of the moment, so their ratio is steadier."""
    rows = []
    for n in sorted({p.nprocs for p in points}):
        native = [p.opens_per_second for p in points if p.nprocs == n and p.mode == "native"]
        bridge = [p.opens_per_second for p in points if p.nprocs == n and p.mode != "native"]
        ratios = [b / a for a, b in zip(native, bridge) if a]
        rows.append({
            "nprocs": n,
            "native_opens_per_second": round(statistics.median(native)),
            "bridge_opens_per_second": round(statistics.median(bridge)),
            "ratio": round(statistics.median(ratios), 3) if ratios else 0.0,
            "ratio_min": round(min(ratios), 3) if ratios else 0.0,
            "ratio_max": round(max(ratios), 3) if ratios else 0.0,
        })
    return rows


def print_summary(rows: Sequence[dict], adapter: str, say=print) -> None:
    say(f"\n{'nprocs':>6} {'native opens/s':>15} {f'bridge+{adapter}':>15} {'ratio':>7}  range")
    for row in rows:
        say(f"{row['nprocs']:>6} {row['native_opens_per_second']:>15} "
            f"{row['bridge_opens_per_second']:>15} {row['ratio']:>7.2f}"
            f"  {row['ratio_min']:.2f}-{row['ratio_max']:.2f}")


def write_json(path: Path, points: Sequence[Point], rows: Sequence[dict], seconds: int,
               adapter: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": "smb2.bench.path-contention-shared",
        "adapter": adapter,
        "seconds_per_point": seconds,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "points": [asdict(p) for p in points],
        "summary": list(rows),
    }, indent=2) + "\n")
