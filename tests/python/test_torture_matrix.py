"""The smbtorture matrix: one native run per suite shared by every bridge
configuration, runs a few at a time, retries that tell a flake from a
regression, and the table and command line around it.

run_suite is replaced here by a scripted one (no smbd): these tests are
about scheduling and judging; the real runs are `make test`'s torture targets.
"""

from __future__ import annotations

import threading
import time

import pytest

from dbwrap_py import smbtorture
from dbwrap_py.cli import torture_configurations, torture_left_out
from dbwrap_py.samba import SambaSetup
from dbwrap_py.smbtorture import Comparison, SuiteRun, compare_matrix, suite_table


class ScriptedRuns:
    """run_suite's stand-in: results per (mode, adapter), counting runs and
    the most that ran at once."""

    def __init__(self, results: dict[tuple[str, str], dict[str, str]],
                 retries: dict[str, str] | None = None) -> None:
        self.results = results
        self.retries = retries or {}  # adapter -> result of a one-subtest rerun
        self.calls: list[tuple[str, str, str]] = []
        self.running = 0
        self.most = 0
        #: how many runs were going on (itself included) at each retry's start
        self.running_at_retry: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, suite: str, setup: SambaSetup, mode: str, timeout: float = 0) -> SuiteRun:
        with self._lock:
            self.calls.append((suite, mode, setup.adapter))
            self.running += 1
            self.most = max(self.most, self.running)
            if suite.count(".") > 1:
                self.running_at_retry.append(self.running)
        time.sleep(0.05)  # long enough for the pool to overlap runs
        with self._lock:
            self.running -= 1
        if suite.count(".") > 1:  # a one-subtest retry, smb2.x.name
            return SuiteRun(suite, mode, results={suite.rsplit(".", 1)[1]: self.retries[setup.adapter]})
        return SuiteRun(suite, mode, results=dict(self.results[(mode, setup.adapter)]))


def bridge(adapter: str) -> SambaSetup:
    return SambaSetup(bridged=("locking.tdb",), adapter=adapter)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> ScriptedRuns:
    runs = ScriptedRuns({
        ("native", "tdb"): {"a": "success", "b": "success", "c": "failure"},
        ("bridge", "tdb"): {"a": "success", "b": "success", "c": "failure"},
        ("bridge", "flaky"): {"a": "success", "b": "failure", "c": "failure"},
        ("bridge", "broken"): {"a": "success", "b": "error", "c": "success"},
    }, retries={"flaky": "success", "broken": "failure"})
    monkeypatch.setattr(smbtorture, "run_suite", runs)
    return runs


def test_one_native_run_per_suite_for_every_configuration(scripted: ScriptedRuns) -> None:
    suites = ["smb2.one", "smb2.two", "smb2.three"]
    rows = compare_matrix(suites, [bridge("tdb"), bridge("flaky"), bridge("broken")], parallel=3)
    natives = [call for call in scripted.calls if call[1] == "native"]
    assert [suite for suite, _, _ in natives] == suites
    assert [row[0].suite for row in rows] == suites
    for row in rows:  # every configuration judged against that suite's one native run
        assert len({id(c.native) for c in row}) == 1
    assert scripted.most == 3


def test_the_slowest_suites_are_queued_first_and_rows_keep_the_given_order(scripted: ScriptedRuns) -> None:
    suites = ["smb2.one", "smb2.create", "smb2.two", "smb2.lease"]
    rows = compare_matrix(suites, [bridge("tdb")], parallel=2)
    natives = [suite for suite, mode, _ in scripted.calls if mode == "native"]
    assert natives == ["smb2.lease", "smb2.create", "smb2.one", "smb2.two"]
    assert [row[0].suite for row in rows] == suites


def test_a_failure_that_passes_alone_is_flaky_one_that_fails_again_a_regression(scripted: ScriptedRuns) -> None:
    (tdb, flaky, broken), = compare_matrix(["smb2.one"], [bridge("tdb"), bridge("flaky"), bridge("broken")],
                                           parallel=4)
    assert (tdb.regressions, tdb.flaky) == ([], [])
    assert (flaky.regressions, flaky.flaky) == ([], ["b"])
    assert (broken.regressions, broken.flaky) == (["b"], [])  # c fails natively: not judged
    retried = [suite for suite, mode, _ in scripted.calls if suite.count(".") > 1]
    assert sorted(retried) == ["smb2.one.b", "smb2.one.b"]
    # the retries come after every run of the matrix, alone
    assert all(suite.count(".") > 1 for suite, _, _ in scripted.calls[-2:])
    assert scripted.running_at_retry == [1, 1]


def test_two_at_a_time_does_not_wait_on_itself(scripted: ScriptedRuns) -> None:
    """A bridge run waits on its suite's native run; with two workers and
    many configurations the native run is always taken first."""
    done = threading.Event()
    result: list[list[list[Comparison]]] = []

    def run() -> None:
        result.append(compare_matrix(["smb2.one", "smb2.two"], [bridge("tdb")] * 4, parallel=2))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "compare_matrix deadlocked"
    assert scripted.most <= 2
    assert [len(row) for row in result[0]] == [4, 4]


def test_suite_table_marks_flakes_and_regressions_and_gives_the_cause() -> None:
    native = SuiteRun("smb2.x", "native", results={"a": "success", "b": "success"}, seconds=10)
    ok = Comparison("smb2.x", native, SuiteRun("smb2.x", "bridge", results={"a": "success", "b": "failure"}),
                    flaky=["b"])
    bad = Comparison("smb2.x", native, SuiteRun("smb2.x", "bridge", results={"a": "success"}),
                     regressions=["b"], causes={"b": ["smbd: NT_STATUS_INTERNAL_ERROR"]})
    lines = suite_table([ok, bad], ["[1]", "[2]"])
    row_b = next(line for line in lines if line.startswith("smb2.x.b "))
    assert row_b.split()[1:] == ["success", "failure*", "-!"]
    assert "  [2] smb2.x.b: fails through the bridge, passes natively" in lines
    assert lines[-1].strip() == "smbd: NT_STATUS_INTERNAL_ERROR"


def test_configurations_from_config_or_adapter_and_options() -> None:
    assert torture_configurations([], "etcd", ["node_cache=yes"]) == [("etcd", {"node_cache": "yes"})]
    assert torture_configurations(["tdb", "etcd,node_cache=yes,lease_ttl=2"], "tdb", []) == [
        ("tdb", {}), ("etcd", {"node_cache": "yes", "lease_ttl": "2"})]
    for bad in (["etcd,node_cache"], [",x=1"]):
        with pytest.raises(ValueError):
            torture_configurations(bad, "tdb", [])
    with pytest.raises(ValueError, match="not both"):
        torture_configurations(["etcd"], "tdb", ["node_cache=yes"])


def test_a_short_configuration_leaves_its_suites_out_unjudged(scripted: ScriptedRuns) -> None:
    """--config-short: the suites a setup leaves out are not run on it, not
    judged (the broken setup fails every suite it does run), and the table
    says not-run; the others still run on every setup."""
    suites = ["smb2.one", "smb2.lease"]
    rows = compare_matrix(suites, [bridge("tdb"), bridge("broken")], parallel=3,
                          left_out=[(), ("smb2.lease",)])
    bridge_runs = sorted((suite, adapter) for suite, mode, adapter in scripted.calls
                         if mode == "bridge" and suite.count(".") == 1)
    assert bridge_runs == [("smb2.lease", "tdb"), ("smb2.one", "broken"), ("smb2.one", "tdb")]
    one, lease = rows
    assert one[1].regressions == ["b"] and not one[1].left_out
    assert lease[1].left_out and (lease[1].regressions, lease[1].flaky) == ([], [])
    lines = suite_table(lease, ["[1]", "[2]"])
    assert lines[0] == "smb2.lease: native 0s, [1] 0s, [2] left out"
    assert next(line for line in lines if line.startswith("smb2.lease.a ")).split()[1:] == [
        "success", "success", "not-run"]


def test_a_flake_shows_the_first_runs_cause() -> None:
    native = SuiteRun("smb2.x", "native", results={"a": "success"})
    first = SuiteRun("smb2.x", "bridge", results={"a": "failure"}, returncode=1,
                     cause=["smbd: cassandra: fetch_locked: Timeout"])
    lines = suite_table([Comparison("smb2.x", native, first, flaky=["a"])], ["[1]"])
    assert "  [1] smb2.x: 1 subtests failed in the first run and passed on retry; that run's cause:" in lines
    assert lines[-1].strip() == "smbd: cassandra: fetch_locked: Timeout"


def test_a_left_out_suite_takes_no_worker(scripted: ScriptedRuns) -> None:
    """Three workers, two setups that leave every suite out and one that
    runs them: the two natives and a bridge run go at once (a left-out
    suite holding a worker until its native run ended kept the matrix
    narrow while its longest suites ran)."""
    short = bridge("broken")
    rows = compare_matrix(["smb2.one", "smb2.two"], [short, short, bridge("tdb")], parallel=3,
                          left_out=[("smb2.one", "smb2.two")] * 2 + [()])
    assert scripted.most == 3
    assert [[c.left_out for c in row] for row in rows] == [[True, True, False]] * 2


def test_a_suite_every_setup_leaves_out_is_not_run_natively_either(scripted: ScriptedRuns) -> None:
    """With only short setups (make test-core), the long suites are not run
    at all: a native run nobody compares against is time for nothing."""
    rows = compare_matrix(["smb2.one", "smb2.lease"], [bridge("tdb"), bridge("tdb")], parallel=3,
                          left_out=[("smb2.lease",)] * 2)
    assert sorted({suite for suite, _, _ in scripted.calls if suite.count(".") == 1}) == ["smb2.one"]
    assert [row[0].suite for row in rows] == ["smb2.one"]


def test_an_interrupted_matrix_starts_no_queued_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C or SIGTERM (the CLI turns it into SystemExit) during the
    matrix: the runs under way finish and stop their smbds, and no queued
    one starts. The pool's own exit waited for every queued run, so a
    stopped make test went on starting smbds (stop 54)."""
    started: list[str] = []

    def interrupted(suite: str, setup: SambaSetup, mode: str, timeout: float = 0) -> SuiteRun:
        first = not started
        started.append(suite)
        time.sleep(0.05)
        if first:
            raise KeyboardInterrupt
        return SuiteRun(suite, mode)

    monkeypatch.setattr(smbtorture, "run_suite", interrupted)
    suites = [f"smb2.s{i}" for i in range(10)]
    with pytest.raises(KeyboardInterrupt):
        compare_matrix(suites, [bridge("tdb"), bridge("flaky")], parallel=2)
    assert len(started) <= 8, started  # of 30 queued: the 2 workers take a few before the cancel


def test_brief_configurations_leave_out_the_long_suites_and_two_more() -> None:
    """make test's matrix: tdb, etcd with the node cache and rados run every
    suite; tdb via the proxy and plain etcd leave out the three longest;
    Cassandra and the fdb model smb2.lock and smb2.durable-v2-open too
    (make test-torture-matrix-long runs both sets on them)."""
    left_out = torture_left_out(3, 2, 2)
    assert left_out[:3] == [(), (), ()]
    assert left_out[3] == left_out[4] == ("smb2.oplock", "smb2.lease", "smb2.durable-open")
    assert set(left_out[5]) == set(left_out[6]) == {
        "smb2.oplock", "smb2.lease", "smb2.durable-open", "smb2.lock", "smb2.durable-v2-open"}
    assert torture_left_out(1, 0, 0) == [()]  # --adapter alone
