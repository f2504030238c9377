"""bench elastic without servers: the per-second analysis, the arguments,
the event schedule, the table and the results files."""

from __future__ import annotations

import json

import pytest

from dbwrap_py.bench import elastic
from dbwrap_py.bench.elastic import JOIN, KILL, LEAVE, Run, Step, analyse, schedule
from dbwrap_py.cli import build_parser
from dbwrap_py.errors import ConfigError
from dbwrap_py.smbtorture import parse_rates


def seconds(n: int) -> list[float]:
    return [float(t) for t in range(1, n + 1)]


def test_a_steady_run_has_no_stall_and_is_back_at_once():
    opens = [500, 1000, 1010, 990, 1000, 1005, 995, 1000]
    a = analyse(seconds(8), opens, at=4)
    assert a.before == 1000  # the median of 1000, 1010, 990: the first second left out
    assert a.worst == 995
    assert a.stall_seconds == 0
    assert a.recovery_seconds == 0.0


def test_a_dip_counts_its_stall_seconds_and_the_time_back_to_90_percent():
    #        before (t 1-4)         after: t=5  6  7    8    9     10
    opens = [1000, 1000, 1000, 1000, 100, 0, 400, 850, 950, 1000]
    a = analyse(seconds(10), opens, at=4)
    assert a.before == 1000
    assert a.worst == 0
    assert a.stall_seconds == 3  # 100, 0, 400 are under 500
    assert a.recovery_seconds == 4.0  # the second ending at 9 (>= 900) began 4 s after the event


def test_a_run_that_never_recovers_says_so():
    opens = [1000, 1000, 1000, 200, 300, 880]
    a = analyse(seconds(6), opens, at=3)
    assert a.stall_seconds == 2
    assert a.recovery_seconds is None


def test_a_second_counts_before_the_event_when_most_of_it_is():
    # smbtorture's labels drift: the second ending at 6.02 is the 6th, before an event at 6
    drifted = [1.0, 2.0, 3.0, 4.0, 5.01, 6.02, 7.02, 8.02]
    a = analyse(drifted, [100, 100, 100, 100, 100, 100, 10, 100], at=6)
    assert (a.before, a.worst, a.stall_seconds, a.recovery_seconds) == (100, 10, 1, 1.02)
    a = analyse([1.0, 2.0, 3.0, 4.0], [10, 10, 2, 10], at=2.4)
    assert a.before == 10 and a.worst == 2  # the second ending at 3 is mostly after 2.4


def test_half_second_bins_give_the_longest_window_under_half_the_rate():
    halves = [0.5 * i for i in range(1, 17)]  # bins ending 0.5 ... 8.0
    #        first second (left out)  before the event at 4 s      after it
    opens = [50, 60, 1000, 1000, 1000, 1000, 1000, 1000,
             400, 1000, 300, 200, 100, 1000, 950, 1000]
    a = analyse(halves, opens, at=4, bin_seconds=0.5)
    assert a.before == 1000  # the first second's two bins left out
    assert a.stall_seconds == 2.0  # four bins under 500
    assert a.longest_stall_seconds == 1.5  # 300, 200, 100 in a row
    assert a.recovery_seconds == 0.5  # back (1000, the bin ending at 5.0) after the first dip
    one_second = analyse(seconds(8), [1000] * 4 + [100, 1000, 100, 100], at=4)
    assert one_second.longest_stall_seconds == 2.0 and one_second.stall_seconds == 3.0


def test_the_load_refuses_what_its_client_cannot_do():
    assert elastic.Load(64, 30).bin_seconds == 0.5
    with pytest.raises(ConfigError, match="--bin 1"):
        elastic.Load(64, 30, elastic.SMBTORTURE, 0.5)
    with pytest.raises(ConfigError, match="--client"):
        elastic.Load(64, 30, "curl")


def test_no_second_before_or_after_the_event_gives_no_analysis():
    assert analyse(seconds(3), [1, 2, 3], at=3) is None
    assert analyse([], [], at=3) is None


def test_smbtortures_labels_become_the_samples_seconds():
    line = ("{t} second: open[num/s=1,234;avslat=0.001;minlat=0.0;maxlat=0.1] "
            "close[num/s=1,230;avslat=0.001;minlat=0.0;maxlat=0.1]\n")
    rates = parse_rates(line.format(t="1.00") + line.format(t="2.00"))
    assert rates.seconds == [1.0, 2.0] and rates.opens == [1234, 1234]


def test_each_event_has_its_steps_those_before_the_clients_first():
    assert schedule(KILL, 10) == [Step(KILL, 10, 2)]
    assert schedule(LEAVE, 10) == [Step(LEAVE, 10, 2)]
    assert schedule(JOIN, 7.5) == [Step(JOIN, 7.5, 3)]  # a fourth node, kept spare until then
    assert [elastic.spare_nodes(e) for e in (KILL, LEAVE, JOIN)] == [0, 0, 1]
    with pytest.raises(ConfigError, match="unknown event"):
        schedule("reboot", 1)


def test_events_parse_in_order_without_repeats_and_unknown_ones_are_refused():
    assert elastic.parse_events("join, kill,join") == [JOIN, KILL]
    for bad in ("", "kill,reboot"):
        with pytest.raises(ConfigError, match="--events"):
            elastic.parse_events(bad)


def test_the_event_needs_a_second_before_and_after_it():
    elastic.check_timing(1, 30, 16)
    elastic.check_timing(29, 30, 16)
    for at in (0, 0.5, 29.5, 30):
        with pytest.raises(ConfigError, match="--at"):
            elastic.check_timing(at, 30, 16)
    with pytest.raises(ConfigError, match="--nprocs"):
        elastic.check_timing(10, 30, 0)


def test_the_command_line_defaults_and_options():
    args = build_parser().parse_args(["bench", "elastic"])
    assert (args.adapters, args.nprocs, args.time, args.at, args.events) == (
        "etcd+cache", 64, 30, 10.0, "kill,leave,join")
    assert (args.client, args.bin) == ("open-loop", None)
    args = build_parser().parse_args(["bench", "elastic", "--adapters", "rados", "-o", "rados:objects=8",
                                      "--nprocs", "8", "--time", "20", "--at", "6", "--events", "kill,join"])
    assert (args.nprocs, args.time, args.at, args.events) == (8, 20, 6.0, "kill,join")
    labels = [c.label for c in elastic.chosen(args.adapters, args.option)]
    assert labels[0] == "ctdb" and len(labels) == 2


def test_ctdb_and_etcd_with_the_node_cache_by_default():
    configs = elastic.chosen("", [])
    assert [c.adapter for c in configs] == [None, "etcd"]
    assert configs[1].options.get("node_cache") == "yes"


def runs() -> list[Run]:
    steady = Run("ctdb", KILL, True, seconds(4), [10, 10, 2, 10])
    steady.analysis = analyse(steady.seconds, steady.opens, 2)
    failed = Run("etcd + node cache", KILL, False, cause=["ClusterError: no etcd"])
    return [steady, failed]


def test_the_table_has_a_row_per_run_and_marks_a_failure():
    lines = elastic.table_lines(runs())
    assert lines[0].split()[:2] == ["event", "configuration"]
    assert lines[1].split() == ["kill", "ctdb", "10", "2", "1", "1", "1", "s"]
    assert lines[2].endswith("FAILED") and " - " in lines[2]


def test_the_results_keep_every_run_and_its_cause_and_chart_the_samples(tmp_path):
    out = tmp_path / "bench-elastic.json"
    files = elastic.write_results(out, runs(), elastic.chosen("", []), {"at": 2}, at=2)
    assert files == [out, out.with_suffix(".png")] and files[1].stat().st_size > 0
    data = json.loads(out.read_text())
    assert [r["label"] for r in data["runs"]] == ["ctdb", "etcd + node cache"]
    assert data["runs"][0]["analysis"]["stall_seconds"] == 1
    assert data["runs"][1]["cause"] == ["ClusterError: no etcd"]
    assert data["bins"].startswith("1 s")


class FakeCluster:
    def __init__(self) -> None:
        self.calls: list = []

    def kill_node(self, pnn: int) -> None:
        self.calls.append((pnn, "kill"))

    def leave_node(self, pnn: int) -> None:
        self.calls.append((pnn, "leave"))

    def join_node(self, pnn: int) -> None:
        self.calls.append((pnn, "join"))


def test_each_action_reaches_its_node():
    cluster = FakeCluster()
    for event in (KILL, LEAVE, JOIN):
        for step in schedule(event, 1):
            elastic.perform(cluster, step)
    assert cluster.calls == [(2, "kill"), (2, "leave"), (3, "join")]
    with pytest.raises(ConfigError, match="unknown action"):
        elastic.perform(cluster, Step("reboot", 1))


def test_the_timer_runs_each_step_and_keeps_a_failure():
    cluster = FakeCluster()
    timer = elastic.EventTimer(cluster, [Step(JOIN, 0, 3)])
    timer.start()
    timer.join()
    assert cluster.calls == [(3, "join")] and timer.error == ""

    def broken(pnn: int) -> None:
        raise RuntimeError("no such node")

    cluster.kill_node = broken
    timer = elastic.EventTimer(cluster, [Step(KILL, 0)])
    timer.start()
    timer.join()
    assert timer.error == "kill of node 2 failed: RuntimeError: no such node"


def test_smbtortures_running_line_is_seen_as_it_comes(tmp_path):
    from dbwrap_py.smbtorture import _run

    seen: list[str] = []
    script = 'echo "Opening 2 connections"; echo "Running for 5 seconds"; echo after; echo "Running for 1"'
    output = _run(["sh", "-c", script], tmp_path, 60, lambda: seen.append("running"))
    assert seen == ["running"]  # once, at the first such line
    assert output.splitlines()[-2:] == ["after", "Running for 1"]


def test_a_streamed_run_past_its_timeout_is_killed_and_keeps_its_output(tmp_path):
    import subprocess

    from dbwrap_py.smbtorture import _run

    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _run(["sh", "-c", "echo started; exec sleep 60"], tmp_path, 0.2, lambda: None)
    assert caught.value.output == "started\n"
