"""The model of FoundationDB behaves as FoundationDB's transactions do, in
what the fdb adapter relies on: so it is a model, not a dict.

Each test pairs what must fail with what must not (the conflicting commit and
the same commit without the conflict, the too-large value and the largest
allowed one), so a model that always refused, or never did, fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dbwrap_py.testing.fdb_model as fdb
from dbwrap_py.testing.fdb_model.throwaway import model_server

pytestmark = pytest.mark.server


API = 730


@pytest.fixture(scope="module")
def cluster_file() -> Iterator[Path]:
    with model_server() as path:
        yield path


@pytest.fixture()
def db(cluster_file: Path) -> fdb.Database:
    fdb.api_version(API)
    return fdb.open(str(cluster_file))


@pytest.fixture()
def control(cluster_file: Path) -> Iterator[fdb.Control]:
    ctl = fdb.Control(str(cluster_file))
    yield ctl
    ctl.set_too_old_seconds(5.0)
    ctl.close()


def unique(name: str) -> bytes:
    return f"{name}/{time.monotonic_ns()}".encode()


def code_of(call) -> int | None:
    try:
        call()
    except fdb.FDBError as exc:
        return exc.code
    return None


def write(db: fdb.Database, key: bytes, value: bytes | None) -> None:
    tr = db.create_transaction()
    if value is None:
        tr.clear(key)
    else:
        tr.set(key, value)
    tr.commit().wait()


def read(db: fdb.Database, key: bytes) -> bytes | None:
    return db.create_transaction().get(key).wait().value


def test_a_commit_whose_read_was_overwritten_is_refused(db: fdb.Database) -> None:
    watched, other, target = unique("read"), unique("other"), unique("target")
    write(db, watched, b"0")
    # the same transaction shape twice: once with a concurrent write to what it read
    for concurrent, expected in ((other, None), (watched, 1020)):
        tr = db.create_transaction()
        assert tr.get(watched).wait() == b"0"
        write(db, concurrent, b"1")
        tr.set(target, b"written")
        assert code_of(lambda: tr.commit().wait()) == expected
        if expected is None:
            assert read(db, target) == b"written"
            write(db, target, None)
    assert read(db, target) is None, "the refused commit left a write behind"


def test_a_read_gives_a_value_future_as_the_real_binding(db: fdb.Database) -> None:
    key = unique("value")
    missing = db.create_transaction().get(key).wait()
    assert missing is not None and not missing.present() and missing.value is None  # never None itself
    write(db, key, b"here")
    found = db.create_transaction().get(key).wait()
    assert found.present() and found == b"here" and bytes(found) == b"here"


def test_snapshot_reads_add_no_read_conflict(db: fdb.Database) -> None:
    watched, target = unique("snap"), unique("snap-target")
    write(db, watched, b"0")
    tr = db.create_transaction()
    assert tr.snapshot.get(watched).wait() == b"0"
    write(db, watched, b"1")
    tr.set(target, b"x")
    tr.commit().wait()  # no conflict: the read was a snapshot read
    assert read(db, target) == b"x"


def test_reads_see_the_store_as_of_the_read_version(db: fdb.Database) -> None:
    key = unique("mvcc")
    write(db, key, b"old")
    tr = db.create_transaction()
    tr.get_read_version().wait()
    write(db, key, b"new")
    assert tr.snapshot.get(key).wait() == b"old"
    assert read(db, key) == b"new"


def test_read_versions_advance_about_a_million_per_second(db: fdb.Database) -> None:
    first = db.create_transaction().get_read_version().wait()
    time.sleep(0.3)
    second = db.create_transaction().get_read_version().wait()
    assert 200_000 <= second - first <= 1_500_000, second - first


INCREMENTS = """
import sys
import dbwrap_py.testing.fdb_model as fdb
fdb.api_version(730)
db = fdb.open(sys.argv[1])
key = sys.argv[2].encode()

@fdb.transactional
def increment(tr):
    value = tr.get(key).wait().value
    tr.set(key, str(int(value or b"0") + 1).encode())

for _ in range(int(sys.argv[3])):
    increment(db)
"""


def test_transactional_retries_conflicts_and_loses_no_increment(
        db: fdb.Database, control: fdb.Control, cluster_file: Path) -> None:
    key = unique("counter")
    control.inject("not_committed", count=3)
    before = control.stats().get("conflicts", 0)
    children = [subprocess.Popen([sys.executable, "-c", INCREMENTS, str(cluster_file), key.decode(), "300"])
                for _ in range(3)]
    assert [child.wait(timeout=120) for child in children] == [0, 0, 0]
    assert read(db, key) == b"900"
    stats = control.stats()
    assert stats["injected_not_committed"] >= 3
    print(f"conflicts retried: {stats.get('conflicts', 0) - before}")


def test_a_watch_fires_on_change_and_not_before(db: fdb.Database) -> None:
    key = unique("watch")
    write(db, key, b"a")
    tr = db.create_transaction()
    tr.get(key).wait()
    watch = tr.watch(key)
    tr.commit().wait()
    time.sleep(0.3)
    assert not watch.is_ready(), "the watch fired with no change"
    write(db, key, b"b")
    deadline = time.monotonic() + 5
    while not watch.is_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.is_ready()
    watch.wait()


def test_a_cancelled_watch_reports_cancellation(db: fdb.Database) -> None:
    tr = db.create_transaction()
    watch = tr.watch(unique("cancel"))
    tr.commit().wait()
    watch.cancel()
    assert code_of(watch.wait) == 1101


def test_size_limits_give_foundationdbs_errors(db: fdb.Database) -> None:
    tr = db.create_transaction()
    assert code_of(lambda: tr.set(b"k" * 10_001, b"v")) == 2102
    assert code_of(lambda: tr.set(unique("v"), b"v" * 100_001)) == 2103
    tr.set(b"k" * 10_000, b"v" * 100_000)  # the largest allowed
    tr.commit().wait()
    assert read(db, b"k" * 10_000) == b"v" * 100_000

    big = db.create_transaction()
    prefix = unique("big")
    for i in range(101):  # 101 values of 100,000 bytes: over 10,000,000
        big.set(prefix + b"/%03d" % i, b"x" * 100_000)
    assert code_of(lambda: big.commit().wait()) == 2101
    assert code_of(lambda: big.on_error(2101).wait()) == 2101, "2101 is not retryable"
    assert db.create_transaction().get_range(prefix, prefix + b"0") == []
    fits = db.create_transaction()
    for i in range(95):
        fits.set(prefix + b"/%03d" % i, b"x" * 100_000)
    fits.commit().wait()


def test_transaction_too_old_after_the_configured_time(db: fdb.Database, control: fdb.Control) -> None:
    control.set_too_old_seconds(0.5)
    key = unique("old")
    tr = db.create_transaction()
    tr.get(key).wait()
    time.sleep(0.2)
    tr.get(key).wait()  # still inside the window
    time.sleep(0.5)
    assert code_of(lambda: tr.get(key).wait()) == 1007
    tr.set(key, b"late")
    assert code_of(lambda: tr.commit().wait()) == 1007
    assert read(db, key) is None
    tr.on_error(1007).wait()  # retryable: a new read version
    tr.set(key, b"retried")
    tr.commit().wait()
    assert read(db, key) == b"retried"


@pytest.mark.parametrize("outcome, applied", [("applied", True), ("dropped", False)])
def test_injected_commit_unknown_result_may_or_may_not_have_applied(
        db: fdb.Database, control: fdb.Control, outcome: str, applied: bool) -> None:
    key = unique("unknown")
    control.inject("unknown", count=1, outcome=outcome)
    tr = db.create_transaction()
    tr.set(key, b"v")
    try:
        tr.commit().wait()
    except fdb.FDBError as exc:
        error = exc
    else:
        pytest.fail("no commit_unknown_result")
    assert error.code == 1021
    assert fdb.predicates.maybe_committed(error) and fdb.predicates.retryable(error)
    assert (read(db, key) == b"v") is applied
    tr.on_error(error).wait()  # retryable, as the real one
    tr.set(key, b"v")
    tr.commit().wait()
    assert read(db, key) == b"v"


def test_retry_limit_and_timeout_options(db: fdb.Database, control: fdb.Control) -> None:
    tr = db.create_transaction()
    tr.options.set_retry_limit(1)
    tr.on_error(1020).wait()
    assert code_of(lambda: tr.on_error(1020).wait()) == 1020
    slow = db.create_transaction()
    slow.options.set_timeout(300)
    slow.get(b"x").wait()
    time.sleep(0.2)
    slow.on_error(1020).wait()  # a retry does not restart the timeout
    time.sleep(0.15)
    assert code_of(lambda: slow.get(b"x").wait()) == 1031
    assert code_of(lambda: slow.on_error(1031).wait()) == 1031, "1031 is not retryable"
    slow.reset()  # reset does
    slow.get(b"x").wait()


def test_a_child_forked_after_the_network_started_cannot_use_it(
        db: fdb.Database, cluster_file: Path) -> None:
    db.create_transaction().get(b"x").wait()  # the network runs in this process
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            assert fdb.open(str(cluster_file)) is db  # cached, as the real fdb.open
            db.create_transaction().get(b"x").wait()
        except fdb.FDBError as exc:
            code = 0 if exc.code == 2008 else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


def test_keys_deleted_before_the_window_are_forgotten() -> None:
    from dbwrap_py.testing.fdb_model.server import SWEEP_EVERY, Store

    store = Store(too_old_seconds=0.05)
    keep = [("set", b"kept", b"v")]
    store.commit(store.read_version(), [], [(b"kept", b"kept\0")], keep)
    for i in range(50):
        key = b"gone%02d" % i
        store.commit(store.read_version(), [], [(key, key + b"\0")], [("set", key, b"x")])
        store.commit(store.read_version(), [], [(key, key + b"\0")], [("clear", key)])
    time.sleep(0.1)
    while store.counts["commits"] % SWEEP_EVERY:
        store.commit(store.read_version(), [], [(b"kept", b"kept\0")], keep)
    assert store.keys == [b"kept"]
    assert store.get(store.read_version(), b"kept") == b"v"


def _without_the_test_run_mark() -> dict[str, str]:
    from dbwrap_py.testing.fdb_model.tests_only import ENV

    return {k: v for k, v in os.environ.items() if k != ENV}


def test_the_models_server_refuses_to_serve_outside_a_test_run(tmp_path):
    sock = tmp_path / "model.sock"
    run = subprocess.run([sys.executable, "-m", "dbwrap_py.testing.fdb_model.server", "--socket", str(sock)],
                         env=_without_the_test_run_mark(), cwd="/", capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "serves tests only" in run.stderr, run.stderr
    assert not sock.exists()
