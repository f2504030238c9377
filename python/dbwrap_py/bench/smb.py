"""SMB-level benchmark: path-contention-shared, native tdb against the bridge.

Both Sambas run at once and the measurements alternate (native, bridge) at
each point, so the load of this shared machine drifts over both alike. Only
ratios taken in the same run mean anything.

* run(): native tdb against one adapter (the demo and `make bench-smb`);
* sweep(): native tdb and every given adapter, one throwaway Samba each, all
  up at once; at each nprocs every backend is measured in turn, native
  first, so the ratios of one round share the machine's load;
* sweep_summary(), table_lines(), write_sweep_json(), write_sweep_csv():
  medians, ratios to native tdb, and the files under results/.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dbwrap_py.errors import DbwrapError
from dbwrap_py.samba import VOLATILE_DATABASES, SambaError, SambaSetup, ThrowawaySamba
from dbwrap_py.smbtorture import Rates, path_contention, setup_for

NATIVE = "native"


@dataclass
class Point:
    mode: str
    nprocs: int
    opens_per_second: float
    closes_per_second: float
    open_latency_ms: float
    close_latency_ms: float
    ok: bool
    #: which pass over the nprocs points (a sweep's rounds)
    round_index: int = 0
    #: why the point failed, one cause per line (smbd's log, smbtorture), else empty
    error: str = ""
    #: per open+close, what the sweep counts: the backend's own requests by
    #: kind (its test hooks' store_counters); a cluster sweep adds its node
    #: agents' metrics ("agent ...") and CPU milliseconds by process ("cpu ms ...")
    per_open: dict[str, float] = field(default_factory=dict)
    #: opens/s of each node's clients (PNN -> opens/s), where each smbtorture
    #: process ran on one node (a cluster sweep's own-files); else empty
    per_node: dict[int, float] = field(default_factory=dict)

    def failure_lines(self) -> list[str]:
        return self.error.splitlines()


def _point(mode: str, nprocs: int, rates: Rates) -> Point:
    def mean(xs: list[float]) -> float:
        xs = xs[1:] if len(xs) > 2 else xs
        return 1000 * sum(xs) / len(xs) if xs else 0.0

    return Point(mode, nprocs, rates.opens_per_second, rates.closes_per_second,
                 mean(rates.open_latency), mean(rates.close_latency), rates.ok,
                 error="\n".join(rates.cause),
                 per_node={node: round(opens, 1) for node, opens in rates.per_node.items()})


def run(nprocs: Sequence[int], seconds: int, adapter: str = "tdb",
        rounds: int = 1, say=print) -> list[Point]:
    """Every nprocs point, native then bridge, `rounds` times each; a failed
    point is followed by its cause."""
    points: list[Point] = []
    with ThrowawaySamba(setup_for("native")) as native, \
            ThrowawaySamba(setup_for("bridge", adapter)) as bridge:
        for n in nprocs:
            for _ in range(rounds):
                for mode, samba in (("native", native), (f"bridge+{adapter}", bridge)):
                    point = _point(mode, n, path_contention(samba, n, seconds))
                    points.append(point)
                    say(f"  nprocs={n:<3} {mode:<14} {point.opens_per_second:9.0f} opens/s"
                        f" {point.closes_per_second:9.0f} closes/s{'' if point.ok else '  FAILED'}")
                    for line in point.failure_lines():
                        say(f"      {line}")
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


# -- the sweep: native tdb and every adapter --------------------------------


@dataclass
class Backend:
    """One throwaway Samba of the sweep: native tdb, or smbd's volatile
    databases on the bridge with ``adapter``."""

    adapter: str | None  # None: native tdb
    options: Mapping[str, str] = field(default_factory=dict)
    #: volatile databases left on native tdb (the seed's smbXsrv_open_global, node-local)
    local: Sequence[str] = ()

    @property
    def label(self) -> str:
        from dbwrap_py.bench.targets import display_name

        return NATIVE if self.adapter is None else f"bridge+{display_name(self.adapter, self.options)}"

    def counters(self) -> dict[str, int]:
        """The backend's own request counters (none for native tdb)."""
        if self.adapter is None:
            return {}
        from dbwrap_py.testing.hooks import hooks_for

        return hooks_for(self.adapter).store_counters(self.options)

    def setup(self) -> SambaSetup:
        if self.adapter is None:
            return setup_for("native")
        bridged = [db for db in VOLATILE_DATABASES if db not in self.local]
        return setup_for("bridge", self.adapter, dict(self.options), bridged)


def measure(samba: ThrowawaySamba, label: str, nprocs: int, seconds: int,
            round_index: int, counters: Callable[[], dict[str, int]] = dict) -> Point:
    """One point; a failed or hung run gives a failed point with its cause.
    ``counters`` gives the backend's request counters before and after."""
    point, _ = measure_with(lambda on_running: path_contention(samba, nprocs, seconds, on_running), label,
                            nprocs, round_index, counters)
    return point


def measure_with(run: Callable[[Callable[[], None]], Rates], label: str, nprocs: int, round_index: int,
                 counters: Callable[[], Mapping[str, float]] = dict) -> tuple[Point, Rates]:
    """The point of one smbtorture ``run`` (and its rates), with what
    ``counters`` counts (the backend's requests, CPU time, ...) per
    open+close, from readings before and after. ``run`` is given a callback
    to call once every client is connected (smbtorture's RUNNING): the
    first reading is taken again then, so the clients' connects, which
    smbtorture's rate leaves out, do not count against the opens."""
    readings = {"before": counters()}

    def on_running() -> None:
        readings["before"] = counters()

    rates = run(on_running)
    after = counters()
    before = readings["before"]
    point = _point(label, nprocs, rates)
    point.round_index = round_index
    opens = sum(rates.opens)
    if opens:
        point.per_open = {kind: round((after[kind] - before.get(kind, 0)) / opens, 4)
                                for kind in after if after[kind] != before.get(kind, 0)}
    return point, rates


def per_node_text(per_node: Mapping[int, float]) -> str:
    """Opens/s per node: "node 0 812, node 1 790, node 2 95"."""
    return ", ".join(f"node {node} {opens:.0f}" for node, opens in sorted(per_node.items()))


def point_line(point: Point, width: int = 22) -> str:
    """A point as the sweeps print it: opens/s, latency, the backend's
    requests per open, opens/s per node where measured; a failed one with
    its cause below."""
    store = "".join(f", {kind} {n:.3f}/open" for kind, n in sorted(point.per_open.items())
                    if kind not in ("LeaseKeepAlive",))
    nodes = f"\n      opens/s per node: {per_node_text(point.per_node)}" if point.per_node else ""
    return (f"  nprocs={point.nprocs:<4} {point.mode:<{width}} {point.opens_per_second:8.0f} opens/s "
            f"{point.open_latency_ms:8.2f} ms{store}{nodes}"
            + ("" if point.ok else "  FAILED\n" + "\n".join(
                f"      {line}" for line in point.failure_lines())))


def start_sambas(stack: ExitStack, backends: Sequence[Backend],
                 on_error: Callable[[str, str], None]) -> dict[str, ThrowawaySamba]:
    """A throwaway Samba per backend; one that will not start is reported and left out."""
    sambas = {}
    for backend in backends:
        try:
            sambas[backend.label] = stack.enter_context(ThrowawaySamba(backend.setup()))
        except (SambaError, DbwrapError) as exc:
            on_error(backend.label, str(exc).splitlines()[0] if str(exc) else repr(exc))
    return sambas


def sweep(backends: Sequence[Backend], nprocs: Sequence[int], seconds: int, rounds: int = 1,
          on_start: Callable[[str, int], None] = lambda *_: None,
          on_point: Callable[[Point], None] = lambda _: None,
          on_error: Callable[[str, str], None] = lambda *_: None) -> list[Point]:
    """Every backend at every nprocs, ``rounds`` passes; within one nprocs and
    round the backends run one after the other, in the order given."""
    points: list[Point] = []
    with ExitStack() as stack:
        sambas = start_sambas(stack, backends, on_error)
        counters = {b.label: b.counters for b in backends}
        for n in nprocs:
            for round_index in range(rounds):
                for label, samba in sambas.items():
                    on_start(label, n)
                    point = measure(samba, label, n, seconds, round_index, counters[label])
                    points.append(point)
                    on_point(point)
    return points


def _ratios(points: Sequence[Point], label: str, nprocs: int, reference: str = NATIVE) -> list[float]:
    """label/reference opens per round at nprocs: pairs measured in the same round."""
    def by_round(mode: str) -> dict[int, float]:
        return {p.round_index: p.opens_per_second for p in points
                if p.nprocs == nprocs and p.mode == mode and p.ok}

    base, other = by_round(reference), by_round(label)
    return [other[r] / base[r] for r in sorted(other) if base.get(r)]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def sweep_summary(points: Sequence[Point], reference: str = NATIVE) -> list[dict]:
    """One row per (nprocs, backend): medians over the rounds of opens/s,
    closes/s and latencies, and the median of the per-round ratios to
    ``reference`` (native tdb). Failed points count as no sample."""
    rows = []
    labels = list(dict.fromkeys(p.mode for p in points))
    for n in sorted({p.nprocs for p in points}):
        for label in labels:
            mine = [p for p in points if p.nprocs == n and p.mode == label and p.ok]
            ratios = _ratios(points, label, n, reference)
            rows.append({
                "nprocs": n,
                "backend": label,
                "samples": len(mine),
                "opens_per_second": round(_median([p.opens_per_second for p in mine])),
                "closes_per_second": round(_median([p.closes_per_second for p in mine])),
                "open_latency_ms": round(_median([p.open_latency_ms for p in mine]), 3),
                "close_latency_ms": round(_median([p.close_latency_ms for p in mine]), 3),
                "ratio": round(_median(ratios), 3),
                "ratio_min": round(min(ratios), 3) if ratios else 0.0,
                "ratio_max": round(max(ratios), 3) if ratios else 0.0,
            })
    return rows


def ratio_text(ratio: float) -> str:
    """Two decimals, three below 0.1 so that small ratios still differ."""
    return f"{ratio:.2f}" if ratio >= 0.095 else f"{ratio:.3f}"


def _cell(row: Mapping | None, reference: str = NATIVE) -> str:
    if row is None:
        return "failed"
    if not row["samples"]:
        return row.get("missing") or "failed"
    if row["backend"] == reference:
        return f"{row['opens_per_second']}"
    return f"{row['opens_per_second']} ({ratio_text(row['ratio'])})"


def table_lines(rows: Sequence[Mapping], reference: str = NATIVE) -> list[str]:
    """opens/s per nprocs and backend, with the ratio to ``reference``
    (native tdb) in brackets; a row with no sample shows its ``missing``
    (why it was not measured) or ``failed``."""
    labels = list(dict.fromkeys(r["backend"] for r in rows))
    return grid_lines(rows, labels, lambda row: _cell(row, reference), min_width=20)


def grid_lines(rows: Sequence[Mapping], labels: Sequence[str], cell: Callable[[Mapping | None], str],
               min_width: int) -> list[str]:
    """A row per client count, a column per label: ``cell`` of the summary
    row of that count and label (None where there is none)."""
    by_key = {(r["nprocs"], r["backend"]): r for r in rows}
    width = max([min_width, *(len(label) + 1 for label in labels)])
    lines = [f"{'nprocs':>6} " + " ".join(f"{label:>{width}}" for label in labels)]
    for n in sorted({r["nprocs"] for r in rows}):
        lines.append(f"{n:>6} " + " ".join(f"{cell(by_key.get((n, label))):>{width}}" for label in labels))
    return lines


def write_sweep_json(path: Path, points: Sequence[Point], rows: Sequence[Mapping],
                     seconds: int, rounds: int, skipped: Mapping[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": "smb2.bench.path-contention-shared",
        "reference": NATIVE,
        "seconds_per_point": seconds,
        "rounds": rounds,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "skipped": dict(skipped),
        "points": [asdict(p) for p in points],
        "summary": list(rows),
    }, indent=2) + "\n")


def write_csv(path: Path, rows: Sequence[Mapping]) -> None:
    """Dicts with the same keys, one line each (points via dataclasses.asdict)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
