"""The conformance suite on every adapter here, on native tdb, and on the
broken examples, each of which must fail exactly the checks it breaks."""

from __future__ import annotations

import importlib

import pytest

from dbwrap_py.conformance import list_checks, run_suite
from dbwrap_py.conformance.pytest_plugin import conformance_tests

# `make test-conformance` prints the tables for tdb, memory and etcd; these
# are the rest. Samba's own tdb must pass every check: the checks encode
# what Samba does.
test_native_tdb = conformance_tests(None)
test_tdb_python_path = conformance_tests("tdb", {"native_records": "no"})
test_sqlite = conformance_tests("sqlite")
# 2 s leases, as the etcd, rados and cassandra tables: no record-lock lease
# is renewed in process, so a holder stalled past it is fenced out, and
# beside make test's other lanes a 1 s one was (an increment refused, stop 54)
test_sqlite_leased = conformance_tests("sqlite_leased", {"lease": "2"})

BROKEN = ["lost_update", "no_fencing", "wrong_status", "raising", "forgets_copy"]
#: how a check of a later Samba's rules skips on an older one
NOT_IN_THIS_RELEASE = "has no per-record persistence (from 4.25)"


@pytest.mark.parametrize("name", BROKEN)
def test_broken_example_fails_what_it_breaks_and_nothing_else(name: str) -> None:
    module = f"dbwrap_py.conformance.broken.{name}"
    broken = importlib.import_module(module)
    may_break = getattr(broken, "MAY_BREAK", frozenset())
    run = run_suite(module)
    failed = run.names("fail")
    # forgets_copy breaks 4.25's rules only: before 4.25 those checks skip
    older = {r.name for r in run.results if r.result == "skip" and NOT_IN_THIS_RELEASE in r.note}
    assert not older or older >= {r.name for r in run.results if r.name.startswith("persistent.")}
    breaks = broken.BREAKS - older
    assert breaks <= failed <= broken.BREAKS | may_break, "\n".join(
        f"{r.name}: {r.result}: {r.note}" for r in run.results if r.result != "pass")


def test_broken_examples_declare_real_checks() -> None:
    names = {name for name, _ in list_checks()}
    for name in BROKEN:
        broken = importlib.import_module(f"dbwrap_py.conformance.broken.{name}")
        declared = broken.BREAKS | getattr(broken, "MAY_BREAK", frozenset())
        assert broken.BREAKS and declared <= names, f"{name} declares unknown checks {declared - names}"


def test_single_process_adapter_skips_with_its_reason() -> None:
    run = run_suite("memory", only=["lock.counter", "lock.fencing"])
    assert len(run.results) == 2
    for result in run.results:
        assert result.result == "skip" and "single-process" in result.note


def test_lease_adapter_reports_its_release_time() -> None:
    run = run_suite("sqlite_leased", {"lease": "1"}, only=["lock.release-on-kill"])
    (result,) = run.results
    assert result.result == "pass"
    waited_ms = int(result.measured.split()[2])  # "lock free N ms after SIGKILL ..."
    assert 500 <= waited_ms <= 2000, result.measured



def test_checks_skip_with_the_reason_when_no_server_can_start(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no etcd binary anywhere
    run = run_suite("etcd", only=["kv.values", "lock.fencing"])
    assert [r.result for r in run.results] == ["skip", "skip"]
    assert all("etcd" in r.note and "server" in r.note for r in run.results)


def test_a_failed_child_process_says_why() -> None:
    # the raising example fails every increment: the note must carry the
    # child's own words and the bridge's log line, not a bare count
    run = run_suite("dbwrap_py.conformance.broken.raising", only=["lock.mixed"])
    (result,) = run.results
    assert result.result == "fail"
    assert "processes failed an increment; child " in result.note, result.note
    assert "lock, broken on purpose" in result.note and "increment 0 of counter-0" in result.note, result.note
