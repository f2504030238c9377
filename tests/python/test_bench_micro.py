"""bench micro: bench_micro's JSON, the p50/p99 table, round trips, CSV."""

import csv
import json

from dbwrap_py.bench import micro
from dbwrap_py.adapter import DatabaseSpec
from dbwrap_py.adapters.memory import ADAPTER as MemoryAdapter
from dbwrap_py.options import Options


def output(backend: str, trips: float, p50: float = 1.0) -> str:
    row = {"workload": "smbd open+close", "keys": "zipfian", "mix": "8 do_locked",
           "ops": 100, "ops_per_second": 1000.0, "mean_us": 1.5, "p50_us": p50, "p90_us": 2.0,
           "p99_us": 3.0, "max_us": 9.0, "round_trips_per_op": trips}
    single = dict(row, workload="parse_record", keys="uniform", mix="")
    return json.dumps({"backend": backend, "keys": 10, "results": [single, row]})


def test_parse_output_maps_no_count_to_none():
    native = micro.parse_output(output("native", -1.0))
    assert [r.label for r in native] == ["parse_record", "smbd open+close (zipfian)"]
    assert native[0].round_trips_per_op is None
    etcd = micro.parse_output(output("etcd", 27.0))
    assert etcd[1].round_trips_per_op == 27.0 and etcd[1].backend == "etcd"


def test_table_shows_p50_p99_per_backend_and_round_trips():
    results = micro.parse_output(output("native", -1.0)) + \
        micro.parse_output(output("etcd", 27.0, p50=400.0))
    lines = micro.table(results)
    assert lines[0].split()[-2:] == ["native", "etcd"]
    assert lines[2].split()[-2:] == ["1.0/3.0", "400.0/3.0"]
    assert lines[3] == "round trips per operation, etcd: parse_record 27.0, smbd open+close (zipfian) 27.0"
    assert lines[4] == "round trips per operation: n/a for native (no network)"


def test_csv_writes_n_a_for_no_count(tmp_path):
    results = micro.parse_output(output("native", -1.0))
    micro.write_csv(tmp_path / "m.csv", results)
    with (tmp_path / "m.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["round_trips_per_op"] for r in rows] == ["n/a", "n/a"]
    assert rows[1]["workload"] == "smbd open+close" and rows[1]["keys"] == "zipfian"


def test_bench_command_passes_options():
    command = micro.bench_command("bin", "etcd", {"endpoints": "127.0.0.1:1"}, 10, 0.5, 7, "/d")
    assert command == ["bin", "etcd", "-n", "10", "-t", "0.5", "-k", "7", "-d", "/d",
                       "-o", "endpoints=127.0.0.1:1"]


def test_round_trips_sums_the_counters_of_live_adapters():
    before = micro.round_trips()
    adapters = [MemoryAdapter(DatabaseSpec(f"/x/{i}.tdb"), Options({})) for i in range(2)]
    if before == -1:
        assert micro.round_trips() == -1  # memory adapters keep no count
        before = 0
    for i, adapter in enumerate(adapters):
        adapter.round_trips = 5 + i
    assert micro.round_trips() == before + 11
