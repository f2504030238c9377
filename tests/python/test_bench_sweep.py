"""The SMB sweep's arithmetic: medians, per-round ratios to native tdb, tables, CSV."""

import csv
import json
from dataclasses import asdict

from dbwrap_py.bench.smb import (Point, sweep_summary, table_lines, write_csv,
                                write_sweep_json)


def point(mode: str, nprocs: int, opens: float, round_index: int = 0, ok: bool = True,
          latency: float = 1.0) -> Point:
    return Point(mode, nprocs, opens, opens - 1, latency, latency / 2, ok, round_index)


POINTS = [
    point("native", 1, 1000, 0), point("bridge+tdb", 1, 900, 0), point("bridge+etcd", 1, 50, 0),
    point("native", 1, 2000, 1), point("bridge+tdb", 1, 1000, 1), point("bridge+etcd", 1, 60, 1),
    point("native", 1, 1000, 2), point("bridge+tdb", 1, 800, 2), point("bridge+etcd", 1, 0, 2, ok=False),
    point("native", 4, 4000, 0), point("bridge+tdb", 4, 3000, 0), point("bridge+etcd", 4, 0, 0, ok=False),
]


def rows_by_key():
    return {(r["nprocs"], r["backend"]): r for r in sweep_summary(POINTS)}


def test_ratio_is_the_median_of_ratios_within_each_round():
    tdb = rows_by_key()[(1, "bridge+tdb")]
    assert tdb["opens_per_second"] == 900
    assert tdb["ratio"] == 0.8  # median of 0.9, 0.5, 0.8
    assert (tdb["ratio_min"], tdb["ratio_max"]) == (0.5, 0.9)
    assert tdb["samples"] == 3


def test_failed_points_are_no_sample():
    rows = rows_by_key()
    etcd = rows[(1, "bridge+etcd")]
    assert etcd["samples"] == 2
    assert etcd["opens_per_second"] == 55
    assert etcd["ratio"] == 0.04  # median of 0.05, 0.03
    assert rows[(4, "bridge+etcd")]["samples"] == 0
    assert rows[(4, "bridge+etcd")]["ratio"] == 0.0


def test_native_ratio_is_one_and_latency_is_a_median():
    native = rows_by_key()[(1, "native")]
    assert native["ratio"] == 1.0
    assert native["open_latency_ms"] == 1.0
    assert native["close_latency_ms"] == 0.5


def test_table_has_a_column_per_backend_and_a_line_per_nprocs():
    lines = table_lines(sweep_summary(POINTS))
    assert lines[0].split() == ["nprocs", "native", "bridge+tdb", "bridge+etcd"]
    assert lines[1].split() == ["1", "1000", "900", "(0.80)", "55", "(0.040)"]
    assert lines[2].split() == ["4", "4000", "3000", "(0.75)", "failed"]


def test_csv_and_json_hold_every_point(tmp_path):
    write_csv(tmp_path / "points.csv", [asdict(p) for p in POINTS])
    with (tmp_path / "points.csv").open() as f:
        read = list(csv.DictReader(f))
    assert len(read) == len(POINTS)
    assert read[1]["mode"] == "bridge+tdb" and float(read[1]["opens_per_second"]) == 900
    rows = sweep_summary(POINTS)
    write_sweep_json(tmp_path / "r.json", POINTS, rows, 5, 3, {"bridge+x": "would not start"})
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["reference"] == "native" and data["rounds"] == 3
    assert len(data["points"]) == len(POINTS) and data["summary"] == rows
    assert data["skipped"] == {"bridge+x": "would not start"}


def test_progress_weights_points_by_clients():
    from dbwrap_py.bench.progress import SweepProgress, point_weight

    assert point_weight(128, 5) > point_weight(1, 5) > 5
    with SweepProgress(3, [1, 128], 2, 5) as progress:
        assert progress.all_points == 12
        total = progress.bar.total
        progress.skip("bridge+x", "no server")
        assert progress.all_points == 8
        assert abs(progress.bar.total - total * 2 / 3) < 1e-9
        progress.done(128, "one point")
        assert progress.done_points == 1 and progress.bar.n == point_weight(128, 5)
