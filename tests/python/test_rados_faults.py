"""The rados adapter under faults on a real three-OSD Ceph (pool size 3,
min_size 2): an OSD SIGKILLed under a concurrent increment load, and the
mon stopped. (A client SIGKILLed mid-commit: test_rados.py.)"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("rados")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, TDB_SEQNUM, DatabaseSpec  # noqa: E402
from dbwrap_py.testing.servers.rados import CephCluster  # noqa: E402
from dbwrap_py.adapters.rados.adapter import RadosAdapter  # noqa: E402
from dbwrap_py.errors import DbwrapError, Timeout, Unavailable  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402

pytestmark = pytest.mark.server


VOLATILE = TDB_CLEAR_IF_FIRST | TDB_SEQNUM
WORKERS = 4
SECONDS = 8


@pytest.fixture(scope="module")
def ceph():
    with CephCluster(osds=3) as cluster:
        yield cluster


def open_db(ceph, path, **options) -> RadosAdapter:
    values = {**ceph.options(), "op_timeout": "5", "lease": "3", **options}
    return RadosAdapter(DatabaseSpec(str(path), tdb_flags=VOLATILE), Options(values))


def increment_for(ceph, path, seconds: float, report: str) -> None:
    """Increment the counter until ``seconds`` pass; write what happened to ``report``."""
    db = open_db(ceph, path)
    acked = unknown = refused = 0
    errors: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = db.lock_get(b"counter")
        except DbwrapError as exc:  # nothing written: the lock was not taken
            refused += 1
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            continue
        try:
            db.put_unlock(b"counter", b"%d" % (int(value or b"0") + 1))
            acked += 1
        except DbwrapError as exc:  # the write may or may not have landed
            unknown += 1
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
    with open(report, "w") as out:
        json.dump({"acked": acked, "unknown": unknown, "refused": refused, "errors": errors}, out)


def test_a_killed_osd_loses_no_acknowledged_increment(ceph, tmp_path):
    path = tmp_path / "counter.tdb"
    open_db(ceph, path)  # the first opener (it would wipe)
    pids = []
    for i in range(WORKERS):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - a worker
            signal.alarm(SECONDS + 60)  # a hung worker ends, and fails the test
            code = 1
            try:
                increment_for(ceph, path, SECONDS, str(tmp_path / f"w{i}.json"))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    time.sleep(2)
    victim = "osd.1"
    ceph.stop_daemon(victim, sig=signal.SIGKILL)
    time.sleep(2)
    ceph.start_daemon(victim)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert status == 0, "a worker crashed (an error that was not a DbwrapError?)"
    reports = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(WORKERS)]
    acked = sum(r["acked"] for r in reports)
    unknown = sum(r["unknown"] for r in reports)
    final = int(open_db(ceph, path).get(b"counter"))
    print(f"acked {acked}, unknown {unknown}, final {final}, reports {reports}")
    assert acked > 0
    assert acked <= final <= acked + unknown, (final, reports)
    for report in reports:  # every failure was a typed, mapped error
        assert set(report["errors"]) <= {"Timeout", "Unavailable", "FencedOut", "LockConflict"}, report


def test_with_the_mon_stopped_new_clients_fail_within_op_timeout_and_recover(ceph, tmp_path):
    path = tmp_path / "mon.tdb"
    db = open_db(ceph, path)
    db.lock(b"k")
    db.put_unlock(b"k", b"before")
    ceph.stop_daemon("mon.a")
    try:
        assert db.get(b"k") == b"before"  # a connected client needs no mon for data
        pid = os.fork()
        if pid == 0:  # pragma: no cover - a new process: a new client must reach the mon
            signal.alarm(30)
            start = time.monotonic()
            try:
                open_db(ceph, path, op_timeout="2").get(b"k")
                code = 3
            except (Timeout, Unavailable):
                code = 0 if time.monotonic() - start < 4 else 2
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, f"child exit {os.WEXITSTATUS(status)} (2: too slow, 3: no error)"
    finally:
        ceph.start_daemon("mon.a")
    assert open_db(ceph, path).get(b"k") == b"before"
