"""The charts: which points become lines, and that PNG files come out."""

from dbwrap_py.bench.charts import memory_chart, series, sweep_charts

ROWS = [
    {"nprocs": 4, "backend": "native", "samples": 1, "opens_per_second": 4000, "open_latency_ms": 0.5},
    {"nprocs": 1, "backend": "native", "samples": 1, "opens_per_second": 1000, "open_latency_ms": 0.2},
    {"nprocs": 1, "backend": "bridge+tdb", "samples": 1, "opens_per_second": 900, "open_latency_ms": 0.3},
    {"nprocs": 4, "backend": "bridge+tdb", "samples": 0, "opens_per_second": 0, "open_latency_ms": 0},
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_series_sorts_by_nprocs_and_drops_failed_points():
    lines = series(ROWS, "opens_per_second")
    assert lines == {"native": [(1, 1000.0), (4, 4000.0)], "bridge+tdb": [(1, 900.0)]}
    assert series(ROWS, "open_latency_ms")["native"] == [(1, 0.2), (4, 0.5)]


def test_sweep_charts_write_two_pngs(tmp_path):
    paths = sweep_charts(ROWS, tmp_path / "bench-smb", 5)
    assert [p.name for p in paths] == ["bench-smb-ops.png", "bench-smb-latency.png"]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_memory_chart_writes_a_png(tmp_path):
    rows = [{"backend": "native", "connections": 1, "pss_kib_mean": 2048.0},
            {"backend": "bridge+tdb", "connections": 1, "pss_kib_mean": 4096.0}]
    assert memory_chart(rows, tmp_path / "m.png").read_bytes()[:8] == PNG_MAGIC
