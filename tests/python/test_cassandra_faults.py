"""The cassandra adapter on a throwaway three-node Cassandra, replication
factor 3, QUORUM and SERIAL: nodes SIGKILLed under a concurrent increment
load. One node down: no acknowledged increment is lost. Two down: every call
fails within op_timeout with a mapped error, and works again once they are
back."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

pytest.importorskip("cassandra")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec  # noqa: E402
from dbwrap_py.adapters.cassandra import client as cc  # noqa: E402
from dbwrap_py.testing.servers.cassandra import CassandraCluster  # noqa: E402
from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter  # noqa: E402
from dbwrap_py.errors import DbwrapError, Timeout, Unavailable  # noqa: E402
from dbwrap_py.ntstatus import NT_STATUS_DEVICE_NOT_READY, NT_STATUS_IO_TIMEOUT  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.full]  # three-node Cassandras: make test-full


KEYS = [b"counter-%d" % i for i in range(4)]
WORKERS = 3
OP_TIMEOUT = 5


@pytest.fixture(scope="module")
def cluster():
    with CassandraCluster(nodes=3) as three:
        yield three
    cc.close_all()


def _open(options: dict[str, str], path: str) -> CassandraAdapter:
    values = {**options, "consistency": "QUORUM", "serial_consistency": "SERIAL",
              "op_timeout": str(OP_TIMEOUT), "lease": "5"}
    return CassandraAdapter(DatabaseSpec(path, tdb_flags=TDB_CLEAR_IF_FIRST), Options(values))


def _increment_until(options: dict[str, str], path: str, stop_at: float, worker: int, results) -> None:
    """A worker process: locked increments; counts the acknowledged ones and
    those that failed (which may or may not have been applied)."""
    try:
        db = _open(options, path)
    except DbwrapError as exc:
        results.put(f"worker {worker} could not open: {exc}")
        return
    acked = failed = 0
    n = 0
    while time.monotonic() < stop_at:
        key = KEYS[(worker + n) % len(KEYS)]
        n += 1
        try:
            value = db.lock_get(key)
        except DbwrapError:
            continue  # no write was attempted
        try:
            db.put_unlock(key, b"%d" % (int(value or b"0") + 1))
            acked += 1
        except DbwrapError:
            failed += 1
    results.put((acked, failed))


def test_one_node_killed_under_load_loses_no_acknowledged_increment(cluster, tmp_path):
    options = cluster.options()
    path = str(tmp_path / "locking.tdb")
    keeper = _open(options, path)  # keeps the database open: the workers join, no wipe
    results = multiprocessing.get_context("fork").Queue()
    stop_at = time.monotonic() + 20
    workers = [multiprocessing.get_context("fork").Process(
        target=_increment_until, args=(options, path, stop_at, w, results)) for w in range(WORKERS)]
    for w in workers:
        w.start()
    time.sleep(6)
    cluster.stop_node(2)  # SIGKILL: QUORUM is two of three
    for w in workers:
        w.join(60)
    counts = [results.get(timeout=10) for _ in workers]
    assert not [c for c in counts if isinstance(c, str)], counts
    acked = sum(a for a, _ in counts)
    failed = sum(f for _, f in counts)
    total = sum(int(keeper.get(k) or b"0") for k in KEYS)
    assert acked > 0
    assert acked <= total <= acked + failed, f"acked {acked}, failed {failed}, stored {total}"
    cluster.start_node(2)
    keeper.close()


def test_two_nodes_killed_fail_within_op_timeout_then_recover(cluster, tmp_path):
    db = _open(cluster.options(), str(tmp_path / "brlock.tdb"))
    db.lock(b"k")
    db.put_unlock(b"k", b"before")
    cluster.stop_node(1)
    cluster.stop_node(2)
    for call in (lambda: db.get(b"k"), lambda: db.lock(b"k")):
        started = time.monotonic()
        with pytest.raises((Unavailable, Timeout)) as raised:
            call()
        assert time.monotonic() - started < OP_TIMEOUT + 2
        assert raised.value.ntstatus in (NT_STATUS_DEVICE_NOT_READY, NT_STATUS_IO_TIMEOUT)
    cluster.start_node(1)
    cluster.start_node(2)
    deadline = time.monotonic() + 60
    while True:  # the driver reconnects on its own schedule
        try:
            db.lock(b"k")
            break
        except (Unavailable, Timeout):
            assert time.monotonic() < deadline, "no quorum again within 60 s of the restart"
            time.sleep(1)
    db.put_unlock(b"k", b"after")
    assert db.get(b"k") == b"after"
    db.close()
