"""`bench cluster` without servers: which configurations, the smbtorture
command over the nodes, where and why a sweep stops, ratios to ctdb taken
per round, and the results files."""

import csv
import json
import time
from pathlib import Path

import pytest

from dbwrap_py.bench import cluster
from dbwrap_py.bench.cluster import CTDB, Configuration, Results, Sweep, configurations, round_order
from dbwrap_py.bench.limits import CONNECT, ERROR, MEMORY, TIMEOUT, MemoryGuard, MemoryWatch, Stop, \
    failure, mem_available_kib
from dbwrap_py.bench.smb import Point, measure_with, point_line, table_lines
from dbwrap_py.samba import SambaError, SambaSetup, ThrowawaySamba
from dbwrap_py.smbtorture import Rates, parse_rates, unclist_command, write_unclist

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GIB = 1024 * 1024  # in KiB


def meminfo(available_kib: int, total_kib: int = 24 * GIB) -> str:
    return f"MemTotal:       {total_kib} kB\nMemFree:        1000 kB\nMemAvailable:   {available_kib} kB\n"


def point(mode: str, nprocs: int, opens: float, round_index: int = 0, ok: bool = True) -> Point:
    return Point(mode, nprocs, opens, opens, 1000 / max(opens, 1), 0.1, ok, round_index)


# -- which configurations ----------------------------------------------------


def test_ctdb_comes_first_and_cache_variants_are_labelled():
    labels = [c.label for c in configurations("etcd,etcd+cache,fdb", [])]
    assert labels == [CTDB, "etcd", "etcd + node cache", "fdb (model)"]


def test_options_reach_their_adapter_and_a_cache_option_makes_one_configuration():
    (ctdb, etcd, _) = configurations("etcd,rados", ["etcd:node_cache=yes", "rados:objects=1"])
    assert ctdb.adapter is None and ctdb.setup().adapter is None
    assert ctdb.setup().node_local == ("smbXsrv_open_global.tdb",)  # the same on every line
    assert etcd.label == "etcd + node cache"
    assert etcd.options == {"node_cache": "yes"}
    setup = etcd.setup()
    assert setup.databases == ("locking.tdb", "brlock.tdb", "leases.tdb")
    assert setup.node_local == ("smbXsrv_open_global.tdb",)
    # the same configuration twice (by label) runs once
    assert len(configurations("etcd,etcd+cache", ["etcd:node_cache=yes"])) == 2


def test_network_loopback_is_no_profile_and_a_profile_is_kept():
    assert cluster.network_named("loopback") is None and cluster.network_named(None) is None
    assert cluster.network_settings(cluster.network_named("loopback")) == {}
    assert [c.setup().network for c in configurations("etcd", [], network=cluster.network_named("loopback"))] \
        == [None, None]
    assert cluster.network_named("lan") == "lan"


def test_ctdb_sticky_is_a_second_ctdb_line_with_the_locking_databases_sticky():
    configs = configurations("ctdb-sticky,etcd+cache,ctdb-sticky", [], network="lan")
    assert [c.label for c in configs] == [CTDB, cluster.CTDB_STICKY_LABEL, "etcd + node cache"]
    plain, sticky, _ = configs
    assert plain.setup().ctdb_sticky == () and "sticky" not in plain.describe()
    setup = sticky.setup()
    assert setup.adapter is None and setup.ctdb_sticky == ("locking.tdb", "brlock.tdb", "leases.tdb")
    assert setup.network == "lan" and setup.node_local == plain.setup().node_local
    assert sticky.describe()["sticky"] == ["locking.tdb", "brlock.tdb", "leases.tdb"]


def test_a_network_profile_reaches_every_configuration_and_an_unknown_one_is_refused(monkeypatch):
    from dbwrap_py.cluster import netem, tcp_delay
    from dbwrap_py.cluster.netem import PROFILES
    from dbwrap_py.errors import ConfigError

    configs = configurations("etcd,etcd+cache", [], network="region")
    assert [c.setup().network for c in configs] == ["region"] * 3  # ctdb too
    assert all(c.describe()["network"] == "region" for c in configs)
    assert all(c.setup().network is None for c in configurations("etcd", []))
    with pytest.raises(ConfigError, match="unknown network profile 'moon'; known profiles: local") as refused:
        cluster.network_settings("moon")
    assert all(name in str(refused.value) for name in PROFILES)
    monkeypatch.setattr(netem, "netem_missing", lambda: "no sch_netem")
    monkeypatch.setattr(tcp_delay, "tcp_delay_missing", lambda: "")
    assert cluster.network_settings("lan")["network"]["method"] == "tcp-delay"
    monkeypatch.setattr(tcp_delay, "tcp_delay_missing", lambda: "no nft")
    with pytest.raises(ConfigError, match="--network lan: network profile lan: nothing can delay packets "
                                          "here: netem: no sch_netem; tcp delay: no nft"):
        cluster.network_settings("lan")
    # no delay asks nothing of either
    assert cluster.network_settings("local")["network"]["one_way_delay_ms"] == 0
    assert cluster.network_settings("local")["network"]["method"] == "none"
    assert cluster.network_settings(None) == {}


def test_fdb_runs_on_the_model_unless_told_otherwise():
    (_, fdb) = configurations("fdb", [])
    assert fdb.options["fdb_library"] == "model"
    (_, real) = configurations("fdb", ["fdb:fdb_library=real"])
    assert real.label == "fdb"


def test_auto_takes_adapters_with_a_server_each_without_and_with_the_node_cache():
    names = cluster.parse_names("auto")
    assert names[:2] == ["etcd", "etcd+cache"]
    for name in ("rados", "rados+cache", "cassandra", "cassandra+cache", "fdb", "fdb+cache"):
        assert name in names
    # files on one host (each node its own) and scylla's other venv are left out
    for name in ("tdb", "sqlite", "sqlite_leased", "memory", "scylla"):
        assert name not in names
    assert cluster.parse_names("ctdb,etcd") == ["etcd"]
    why = cluster.left_out()
    assert "files on one host" in why["tdb"] and ".venv-scylla" in why["scylla"]
    assert "etcd" not in why


def test_odd_rounds_run_the_configurations_in_reverse():
    configs = configurations("etcd,fdb", [])
    assert [c.label for c in round_order(configs, 0)] == [CTDB, "etcd", "fdb (model)"]
    assert [c.label for c in round_order(configs, 1)] == ["fdb (model)", "etcd", CTDB]


# -- smbtorture over the nodes ---------------------------------------------------


def nodes(tmp_path, ports=(4450, 4450, 4450)):
    return [ThrowawaySamba(SambaSetup(port=port, address=f"127.0.0.{n + 1}"), root=tmp_path / f"smb{n}")
            for n, port in enumerate(ports)]


def test_the_unclist_names_every_node_and_the_command_one_port(tmp_path):
    sambas = nodes(tmp_path)
    unclist = write_unclist(sambas, tmp_path / "unclist")
    assert unclist.read_text() == "//127.0.0.1/test\n//127.0.0.2/test\n//127.0.0.3/test\n"
    command = unclist_command(sambas, unclist, "smb2.bench.path-contention-shared", "torture:nprocs=4")
    assert f"--unclist={unclist}" in command
    assert "--smb-ports=4450" in command
    assert command[-2:] == ["--option=torture:nprocs=4", "smb2.bench.path-contention-shared"]


def test_nodes_on_different_ports_cannot_share_an_unclist(tmp_path):
    with pytest.raises(SambaError, match="one port"):
        write_unclist(nodes(tmp_path, (1, 2, 2)), tmp_path / "unclist")


# -- where and why it stops --------------------------------------------------------

CONNECT_FAILURE = """\
Opening 256 connections
Failed to connect to SMB2 share \\\\127.0.0.2\\test - NT_STATUS_IO_TIMEOUT
Failed opening 87/256 connections
failure: path-contention-shared [
]
"""


def test_clients_that_do_not_connect_are_a_connect_stop():
    rates = parse_rates(CONNECT_FAILURE)
    assert not rates.ok
    assert failure(rates, 256) == (CONNECT, "only 87 of 256 clients connected (NT_STATUS_IO_TIMEOUT)")


def test_a_killed_run_is_a_timeout_stop_and_anything_else_an_error():
    hung = Rates(timed_out=True, cause=["smbtorture ran past 253s", "smbd: something"])
    kind, why = failure(hung, 512)
    assert kind == TIMEOUT and why.startswith("smbtorture ran past 253s with 512 clients")
    broken = Rates(output="loop->error was NT_STATUS_INTERNAL_DB_CORRUPTION",
                   cause=["smbd: dbwrap_py: etcd: deadline exceeded"])
    assert failure(broken, 64) == (ERROR, "smbd: dbwrap_py: etcd: deadline exceeded")


def test_meminfo_gives_available_memory():
    assert mem_available_kib(meminfo(5 * GIB)) == 5 * GIB
    assert mem_available_kib("MemTotal: 1 kB\n") == 0


def test_the_memory_guard_scales_the_largest_point_to_the_next():
    guard = MemoryGuard(reserve_kib=2 * GIB)
    assert guard.refusal(512, 3 * GIB) is None  # nothing measured yet: no grounds to refuse
    guard.learn(4, 4 * GIB)  # a small point (here: something else growing meanwhile) ...
    assert guard.refusal(8, 10 * GIB) is None  # ... is not scaled up
    guard.learn(64, 64 * 20 * 1024)  # 20 MiB a client at 64
    guard.learn(16, 16 * 90 * 1024)  # a smaller point does not override it
    assert guard.per_client_kib == 20 * 1024
    assert guard.refusal(128, 10 * GIB) is None  # 2.5 GiB fits in 10 - 2
    why = guard.refusal(512, 10 * GIB)  # 10 GiB does not
    assert why is not None and "512 clients would take ~10240 MiB" in why and "20.0 MiB a client at 64" in why


def test_the_memory_watch_reports_the_deepest_dip():
    readings = iter([meminfo(10 * GIB), meminfo(9 * GIB), meminfo(7 * GIB)] + [meminfo(8 * GIB)] * 100)
    deadline = time.monotonic() + 30
    with MemoryWatch(interval=0.01, read=lambda: next(readings)) as watch:
        while watch.lowest_kib > 7 * GIB and time.monotonic() < deadline:
            time.sleep(0.01)
    assert watch.used_kib == 3 * GIB


def test_a_stopped_configuration_skips_larger_counts_and_retries_the_failed_one():
    configs = configurations("etcd", [])
    sweep = Sweep(configs, [1, 4, 16, 64], 5, 2, meminfo=lambda: meminfo(20 * GIB))
    sweep.results.stops["etcd"] = Stop(16, 0, CONNECT, "only 3 of 16 clients connected")
    assert sweep.reason_to_skip("etcd", 16, 1) == ""
    assert sweep.reason_to_skip("etcd", 64, 1) == "stopped at 16 clients (connect)"
    assert sweep.reason_to_skip(CTDB, 64, 1) == ""
    # a failure at fewer clients in a later round moves the stop down; one at more does not
    sweep.results.stop("etcd", Stop(64, 1, TIMEOUT, "ran past"))
    sweep.results.stop("etcd", Stop(4, 1, ERROR, "NT_STATUS_INTERNAL_ERROR"))
    assert sweep.results.stops["etcd"].nprocs == 4
    assert sweep.reason_to_skip("etcd", 16, 1) == "stopped at 4 clients (error)"


def test_memory_that_would_run_out_is_a_memory_stop():
    configs = configurations("etcd", [])
    sweep = Sweep(configs, [1, 64, 512], 5, 1, meminfo=lambda: meminfo(6 * GIB))
    sweep.guards["etcd"].learn(64, 64 * 20 * 1024)
    why = sweep.reason_to_skip("etcd", 512, 0)
    assert why.startswith("512 clients would take")
    stop = sweep.results.stops["etcd"]
    assert (stop.nprocs, stop.kind) == (512, MEMORY)


# -- ratios and results -------------------------------------------------------------


def results() -> Results:
    points = [
        point(CTDB, 1, 1000, 0), point("etcd", 1, 100, 0),
        point(CTDB, 1, 2000, 1), point("etcd", 1, 300, 1),
        point(CTDB, 1, 1000, 2), point("etcd", 1, 120, 2),
        point(CTDB, 4, 500, 0), point("etcd", 4, 0, 0, ok=False),
        point(CTDB, 4, 600, 1),
        point(CTDB, 16, 0, 0, ok=False), point("etcd + node cache", 16, 900, 0),
    ]
    stops = {"etcd": Stop(4, 0, CONNECT, "only 1 of 4 clients connected", ["smbtorture: x"])}
    return Results(points=points, stops=stops, not_started=[("rados", 1, "ServerError: no ceph")])


def by_key(rows):
    return {(r["nprocs"], r["backend"]): r for r in rows}


def test_ratios_to_ctdb_are_paired_within_each_round():
    rows = by_key(cluster.summary(results()))
    etcd = rows[(1, "etcd")]
    assert etcd["ratio"] == 0.12  # median of 0.1, 0.15, 0.12
    assert (etcd["ratio_min"], etcd["ratio_max"]) == (0.1, 0.15)
    assert rows[(1, CTDB)]["ratio"] == 1.0
    # no ctdb sample at 16 clients: no ratio, though the point itself counts
    cached = rows[(16, "etcd + node cache")]
    assert cached["samples"] == 1 and cached["ratio"] == 0.0


def test_counts_not_measured_say_why():
    rows = by_key(cluster.summary(results()))
    assert rows[(4, "etcd")]["missing"] == CONNECT
    assert rows[(16, "etcd")]["missing"] == "stopped"
    assert rows[(1, "etcd")]["missing"] == ""
    lines = cluster.ratio_table_lines(list(rows.values()))
    assert lines[0].split() == ["nprocs", "etcd", "etcd", "+", "node", "cache"]
    assert lines[1].split() == ["1", "0.12", "(0.10-0.15)", "not", "run"]
    assert lines[2].split() == ["4", "connect", "not", "run"]
    assert lines[3].split() == ["16", "stopped", "no", "ctdb"]
    opens = table_lines(list(rows.values()), CTDB)
    assert opens[1].split() == ["1", "1000", "120", "(0.12)", "not", "run"]
    assert opens[3].split()[:3] == ["16", "failed", "stopped"]


def test_results_files_keep_stops_and_clusters_that_did_not_start(tmp_path):
    run = results()
    rows = cluster.summary(run)
    configs = configurations("etcd,etcd+cache", [])
    files = cluster.write_results(tmp_path / "bench-cluster.json", run, rows, configs,
                                  {"nprocs": [1, 4, 16], "rounds": 3})
    assert [f.name for f in files] == ["bench-cluster.json", "bench-cluster.csv", "bench-cluster-summary.csv",
                                       "bench-cluster-ops.png", "bench-cluster-latency.png"]
    data = json.loads(files[0].read_text())
    assert data["reference"] == CTDB and data["rounds"] == 3
    assert "CPU cores over loopback" in data["note"]
    assert data["stops"]["etcd"]["nprocs"] == 4 and data["stops"]["etcd"]["kind"] == CONNECT
    assert data["not_started"] == [{"configuration": "rados", "round": 2, "why": "ServerError: no ceph"}]
    assert [c["label"] for c in data["configurations"]] == [CTDB, "etcd", "etcd + node cache"]
    assert len(data["points"]) == len(run.points) and data["interrupted"] is False
    with files[1].open() as f:
        assert len(list(csv.DictReader(f))) == len(run.points)
    with files[2].open() as f:
        assert {r["missing"] for r in csv.DictReader(f)} >= {"connect", "stopped", ""}


def test_the_report_ends_with_where_and_why_each_configuration_stopped():
    run = results()
    lines = cluster.report_lines(cluster.summary(run), run)
    assert lines[-2] == "etcd: stops at 4 clients (round 1): connect: only 1 of 4 clients connected"
    assert lines[-1] == "rados: no measurement in round 2: ServerError: no ceph"
    run.interrupted = True
    assert cluster.report_lines(cluster.summary(run), run)[-1].startswith("interrupted (Ctrl-C)")


def test_charts_are_written_and_name_where_a_line_stops(tmp_path):
    run = results()
    assert cluster.legend_names(run) == {"etcd": "etcd (stops at 4: connect)"}
    paths = cluster.charts(cluster.summary(run), tmp_path / "bench-cluster", run)
    assert [p.name for p in paths] == ["bench-cluster-ops.png", "bench-cluster-latency.png"]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_a_configuration_that_never_ran_has_no_rows():
    run = Results(points=[point(CTDB, 1, 1000)], not_started=[("etcd", 0, "why")])
    assert [r["backend"] for r in cluster.summary(run)] == [CTDB]
    assert Configuration(None).describe() == {"label": CTDB, "volatile databases": "ctdb",
                                              "node_local": ["smbXsrv_open_global.tdb"]}


def test_a_run_on_a_network_profile_says_so_instead_of_loopback(tmp_path, monkeypatch):
    from dbwrap_py.cluster import netem, tcp_delay

    monkeypatch.setattr(netem, "netem_missing", lambda: "no sch_netem")
    monkeypatch.setattr(tcp_delay, "tcp_delay_missing", lambda: "")
    run = results()
    files = cluster.write_results(tmp_path / "bench-cluster.json", run, cluster.summary(run),
                                  configurations("etcd", [], network="region"),
                                  {"rounds": 3, **cluster.network_settings("region")})
    data = json.loads(files[0].read_text())
    assert "loopback" not in data["note"] and "loopback" not in data["cluster"]
    assert "on the 'region' network profile" in data["note"] and "tcp-delay" in data["note"]


def test_own_files_gives_each_client_a_process_up_to_the_cap_then_spreads_them():
    from dbwrap_py.smbtorture import OWN_FILES_PROCESSES, own_files_groups

    assert own_files_groups(4, 3) == [(0, 1), (1, 1), (2, 1), (0, 1)]
    groups = own_files_groups(OWN_FILES_PROCESSES * 2 + 3, 3)
    assert len(groups) == OWN_FILES_PROCESSES and sum(c for _, c in groups) == OWN_FILES_PROCESSES * 2 + 3
    assert {c for _, c in groups} == {2, 3} and {n for n, _ in groups} == {0, 1, 2}


def test_own_files_rates_add_up_per_second_and_a_failed_process_is_named():
    from dbwrap_py.smbtorture import Rates, added_rates

    a = Rates(opens=[10, 20, 30], seconds=[1.0, 2.0, 3.0], closes=[10, 20, 30], open_latency=[1.0] * 3,
              close_latency=[1.0] * 3, ok=True)
    b = Rates(opens=[1, 2], seconds=[1.0, 2.0], closes=[1, 2], open_latency=[3.0] * 2, close_latency=[3.0] * 2,
              ok=True)
    total = added_rates([a, b], False, 10, lambda: "")
    assert total.ok and total.opens == [11, 22] and total.open_latency == [2.0, 2.0]
    broken = Rates(output="NT_STATUS_OBJECT_NAME_NOT_FOUND", ok=False)
    failed = added_rates([a, broken], False, 10, lambda: "")
    assert not failed.ok and failed.cause and failed.cause[0].startswith("process 2 of 2: "), failed.cause
    late = added_rates([a, b], True, 10, lambda: "")
    assert not late.ok and late.cause[0] == "smbtorture ran past 10s"
    # passed, but not one open in the run: said so first, not only its last lines
    idle = Rates(output="smbtorture: 5.01 seconds\nsuccess: path-contention-shared\n", ok=False)
    starved = added_rates([a, idle], False, 10, lambda: "")
    assert not starved.ok and starved.cause[0] == (
        "process 2 of 2: smbtorture passed but printed no second's rate: its clients finished no "
        "open+close in the whole run"), starved.cause


def test_a_workload_not_known_is_refused():
    from dbwrap_py.errors import ConfigError

    with pytest.raises(ConfigError, match="--workload hot: not one of shared, own-files"):
        cluster.Sweep([], [1], 1, 1, workload="hot")


# -- own-files: opens/s per node ----------------------------------------------------


class FakeTorture:
    """subprocess.Popen's stand-in for own-files' smbtortures: three
    seconds of opens, as many per second as its node's ``rate`` (by the
    port in its command line)."""

    rates = {4450: 100, 4451: 40, 4452: 7}
    commands: list[list[str]] = []

    def __init__(self, command: list[str], **_) -> None:
        FakeTorture.commands.append(command)
        port = int(next(arg for arg in command if arg.startswith("--smb-ports=")).split("=")[1])
        self.opens = self.rates[port]

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        return "".join(f"{t}.00 second: open[num/s={self.opens},avslat=0.001,minlat=0.1,maxlat=0.2] "
                       f"close[num/s={self.opens},avslat=0.001,minlat=0.1,maxlat=0.2]\n"
                       for t in (1, 2, 3)) + "success: path-contention-shared\n", None

    def kill(self) -> None:
        pass


class FakeNode:
    """A node's smbd, as own-files sees it: its address, and no log."""

    def __init__(self, pnn: int, share: Path) -> None:
        self.unc, self.credentials, self.port, self.share_path = f"//node{pnn}/share", "u%p", 4450 + pnn, share

    def log_position(self) -> int:
        return 0

    def log_since(self, position: int) -> str:
        return ""


def test_own_files_counts_opens_per_node_and_they_add_up_to_the_whole(tmp_path, monkeypatch):
    from dbwrap_py import smbtorture

    FakeTorture.commands.clear()
    monkeypatch.setattr(smbtorture.subprocess, "Popen", FakeTorture)
    nodes = [FakeNode(pnn, tmp_path) for pnn in range(3)]
    rates = smbtorture.own_files(nodes, tmp_path, 4, 3)  # processes on nodes 0, 1, 2, 0
    assert len(FakeTorture.commands) == 4 and rates.ok
    assert rates.per_node == {0: 200, 1: 40, 2: 7} and rates.opens_per_second == 247
    # through the sweep's point, its line and its JSON
    point, _ = measure_with(lambda on_running: rates, "etcd", 4, 0)
    assert point.per_node == {0: 200, 1: 40, 2: 7}
    assert "opens/s per node: node 0 200, node 1 40, node 2 7" in point_line(point, 26)
    run = Results(points=[point])
    path = tmp_path / "own.json"
    cluster.write_json(path, run, cluster.summary(run), configurations("etcd", []), {"workload": "own-files"})
    data = json.loads(path.read_text())
    assert data["points"][0]["per_node"] == {"0": 200, "1": 40, "2": 7}
    assert data["summary"][0]["per_node"] == {"0": 200, "1": 40, "2": 7}


def test_the_report_gives_each_nodes_opens_median_over_rounds_and_shared_runs_keep_theirs():
    def own(mode: str, nprocs: int, per_node: dict[int, float], round_index: int) -> Point:
        p = point(mode, nprocs, sum(per_node.values()), round_index)
        p.per_node = per_node
        return p

    run = Results(points=[own(CTDB, 1, {0: 900}, 0), own("etcd", 1, {0: 700}, 0),
                          own(CTDB, 4, {0: 800, 1: 400, 2: 400}, 0), own("etcd", 4, {0: 600, 1: 300, 2: 30}, 0),
                          own(CTDB, 4, {0: 1000, 1: 500, 2: 500}, 1), own("etcd", 4, {0: 700, 1: 350, 2: 40}, 1),
                          own(CTDB, 4, {0: 1200, 1: 500, 2: 500}, 2), own("etcd", 4, {0: 650, 1: 320, 2: 20}, 2)])
    rows = cluster.summary(run)
    assert by_key(rows)[(4, "etcd")]["per_node"] == {0: 650, 1: 320, 2: 30}
    lines = cluster.report_lines(rows, run)
    at = lines.index("opens/s per node (node 0 / node 1 / node 2): median over rounds")
    assert lines[at + 1].split() == ["nprocs", CTDB, "etcd"]
    assert lines[at + 2].split() == ["1", "900", "/", "-", "/", "-", "700", "/", "-", "/", "-"]
    assert lines[at + 3].split() == ["4", "1000", "/", "500", "/", "500", "650", "/", "320", "/", "30"]
    # the shared workload measures no node's share: its rows and report are as before
    shared = results()
    assert all("per_node" not in row for row in cluster.summary(shared))
    assert not any("per node" in line for line in cluster.report_lines(cluster.summary(shared), shared))


def test_multi_region_takes_the_relay_and_the_note_names_the_far_node(monkeypatch):
    from dbwrap_py.cluster import netem, tcp_delay

    monkeypatch.setattr(netem, "netem_missing", lambda: "")  # even where netem exists
    monkeypatch.setattr(tcp_delay, "tcp_delay_missing", lambda: "")
    network = cluster.network_settings("multi-region")["network"]
    assert network["method"] == "tcp-delay" and network["far_nodes"] == [2]
    assert (network["one_way_delay_ms"], network["far_one_way_delay_ms"]) == (0.1, 15.0)
    assert "'multi-region' network profile (0.1 ms one way; node 2 15 ms from every other site, tcp-delay" \
        in cluster.note(network=network)
    assert "far_nodes" not in cluster.network_settings("lan")["network"]
