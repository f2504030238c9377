"""The cassandra adapter on a real throwaway Cassandra (one node): what the
conformance suite does not see from outside: round trips, unknown LWT
outcomes resolved (injected in the client, around real statements), the
first-opener wipe, the session a forked child makes for itself, atomic
commits under SIGKILL, and a dead node failing within op_timeout."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("cassandra")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, TDB_SEQNUM, DatabaseSpec  # noqa: E402
from dbwrap_py.adapters.cassandra import client as cc  # noqa: E402
from dbwrap_py.testing.servers.cassandra import CassandraCluster  # noqa: E402
from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter  # noqa: E402
from dbwrap_py.errors import ConfigError, FencedOut, LockConflict, Timeout, Unavailable  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402
from lease_renewal import assert_a_transaction_reading_past_its_lease_commits, assert_renewal_keeps_the_lock  # noqa: E402

pytestmark = pytest.mark.server


VOLATILE = TDB_CLEAR_IF_FIRST | TDB_SEQNUM
PERSISTENT = 0


@pytest.fixture(scope="module")
def cassandra(shared_cassandra):
    """The run's one-node Cassandra, in this module's keyspace (conftest.py)."""
    return shared_cassandra


OPENED: list[CassandraAdapter] = []


@pytest.fixture(autouse=True)
def close_opened():
    yield
    while OPENED:
        OPENED.pop().close()


def open_db(cassandra, tmp_path, name="t.tdb", flags=VOLATILE, **options) -> CassandraAdapter:
    values = {**cassandra.options(), **{k: str(v) for k, v in options.items()}}
    db = CassandraAdapter(DatabaseSpec(str(tmp_path / name), tdb_flags=flags), Options(values))
    OPENED.append(db)
    return db


def store(db: CassandraAdapter, key: bytes, value: bytes) -> None:
    db.lock(key)
    db.put_unlock(key, value)


def test_bad_options_fail_the_open_with_the_reason(cassandra, tmp_path):
    with pytest.raises(ConfigError, match="consistency"):
        open_db(cassandra, tmp_path, consistency="MOST")
    with pytest.raises(ConfigError, match="LOCAL_SERIAL"):
        open_db(cassandra, tmp_path, serial_consistency="QUORUM")
    with pytest.raises(ConfigError, match="together"):
        open_db(cassandra, tmp_path, user="cassandra")


def test_lock_and_read_cost_one_round_trip_when_the_value_is_known(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path, flags=TDB_CLEAR_IF_FIRST)  # no seqnum to bump
    before = db.round_trips
    assert db.lock_get(b"new") is None  # a new record: the guess (none) holds
    db.put_unlock(b"new", b"1")
    assert db.round_trips - before == 2, "take+read, then write+unlock"
    before = db.round_trips
    assert db.lock_get(b"new") == b"1"  # this process wrote it: the guess holds
    db.put_unlock(b"new", b"2")
    assert db.round_trips - before == 2
    other = open_db(cassandra, tmp_path, flags=TDB_CLEAR_IF_FIRST)
    before = other.round_trips
    assert other.lock_get(b"new") == b"2"  # never seen here: a wrong guess, one more try
    other.unlock(b"new")
    assert other.round_trips - before == 3


def test_a_seqnum_database_bumps_its_counter_after_each_write(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path)
    first = db.seqnum()
    store(db, b"k", b"v")
    assert db.seqnum() == first + 1


def test_a_lock_whose_take_outcome_is_unknown_is_read_back(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path)
    db.client.fault = lambda what: what == "lock"  # applied, then reported unknown
    assert db.lock_get(b"k") is None
    db.client.fault = None
    db.put_unlock(b"k", b"mine")  # the lock was ours: the fenced write goes through
    assert db.get(b"k") == b"mine"


def test_a_take_that_never_left_is_not_taken(cassandra, tmp_path):
    # the default op_timeout: its open lock lives op_timeout seconds, and with 1 the
    # open outlived it on a loaded Debian 13 root (CI); nothing here waits on it
    db = open_db(cassandra, tmp_path)
    holder = open_db(cassandra, tmp_path)
    holder.lock(b"k")

    def lost_before_sending(what: str) -> bool:
        raise cc.OutcomeUnknown("injected: the request never reached Cassandra")

    db.client.fault = lost_before_sending
    taken, _ = db.take_lease(b"k", 42, 10, True)
    assert not taken  # the SERIAL read found the holder's token, not 42
    db.client.fault = None
    holder.unlock(b"k")


def test_a_write_whose_outcome_is_unknown_is_resolved_by_its_write_id(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path)
    db.lock(b"k")
    db.client.fault = lambda what: what == "store"  # applied, then reported unknown
    db.put(b"k", b"applied")
    db.client.fault = None
    db.put_unlock(b"k", b"after")
    assert db.get(b"k") == b"after"


def _next_holder_writes(cassandra, tmp_path, value: bytes, persistent: bool = False) -> None:
    """Another process (a forked child) writes the record ``k`` under its own lock."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = CassandraAdapter(DatabaseSpec(str(tmp_path / "t.tdb"), tdb_flags=PERSISTENT if persistent
                                                  else VOLATILE), Options(cassandra.options()))
            if persistent:
                child.transaction_start()
                child.put(b"k", value)
                child.transaction_commit()
            else:
                store(child, b"k", value)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("persistent", [False, True], ids=["write", "commit"])
def test_an_applied_write_is_known_even_after_the_next_holder_wrote(cassandra, tmp_path, monkeypatch, persistent):
    """Between an applied write+unlock (or commit) reported unknown and the
    SERIAL read that resolves it, another process takes the record and
    writes: the receipt, not the record's current state, says it was applied."""
    db = open_db(cassandra, tmp_path, flags=PERSISTENT if persistent else VOLATILE)
    resolve = db._transaction_row if persistent else db._read_serial

    def next_holder_first(*args):
        _next_holder_writes(cassandra, tmp_path, b"next", persistent)
        return resolve(*args)

    db.client.fault = lambda what: what in ("store and unlock", "commit")  # applied, then reported unknown
    if persistent:
        db.transaction_start()
        db.put(b"k", b"ours")
        monkeypatch.setattr(db, "_transaction_row", next_holder_first)
        db.transaction_commit()  # no FencedOut: it was applied
    else:
        db.lock(b"k")
        monkeypatch.setattr(db, "_read_serial", next_holder_first)
        db.put_unlock(b"k", b"ours")  # no FencedOut: it was applied
    db.client.fault = None
    assert db.get(b"k") == b"next"


def test_an_unknown_write_that_was_not_applied_is_fenced_out(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path, lease=1)
    db.lock(b"k")
    time.sleep(2.2)  # the lease's TTL runs out: nothing can apply
    db.client.fault = lambda what: what == "store"
    with pytest.raises(FencedOut):
        db.put(b"k", b"late")
    db.client.fault = None
    assert db.get(b"k") is None


def test_a_renewed_lease_keeps_the_lock_past_its_time(cassandra, tmp_path):
    # a whole-second TTL ends up to a second early: lease 2, renewed every third of a second
    assert_renewal_keeps_the_lock(open_db(cassandra, tmp_path, lease=2),
                                  open_db(cassandra, tmp_path, lease=2), contend_for=0.3)


def test_a_commit_whose_outcome_is_unknown_is_resolved_by_its_commit_id(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path, "p.tdb", PERSISTENT)
    db.transaction_start()
    db.lock(b"a")
    db.put(b"a", b"1")
    db.unlock(b"a")
    db.client.fault = lambda what: what == "commit"
    db.transaction_commit()  # applied, reported unknown, then known from the SERIAL read
    db.client.fault = None
    assert db.get(b"a") == b"1"
    seq = db.seqnum()
    db.transaction_start()
    db.transaction_commit()
    assert db.seqnum() == seq + 1


def test_a_transaction_that_outlives_its_lease_while_it_reads_still_commits(cassandra, tmp_path):
    """The transaction lock is renewed as the transaction works (lease_renewal.py says why).
    A 3 s lease (a TTL that may end 1 s early: renewed every 0.67 s): on a
    2 s one the renewals had 1 s to land, and beside make test's other
    lanes a read and a renewal's Paxos round once took longer."""
    assert_a_transaction_reading_past_its_lease_commits(open_db(cassandra, tmp_path, "long.tdb", PERSISTENT, lease=3))


def test_a_large_transaction_commits_in_one_batch(cassandra, tmp_path):
    """The throwaway cluster raises batch_size_fail_threshold (50 KiB by default)."""
    db = open_db(cassandra, tmp_path, "big.tdb", PERSISTENT)
    db.transaction_start()
    for i in range(300):
        db.put(b"k%d" % i, bytes(1024))
    before = db.round_trips
    db.transaction_commit()
    assert db.round_trips - before == 1
    assert len(list(db.scan())) == 300


def test_a_transaction_excludes_another_and_a_record_lock(cassandra, tmp_path):
    first = open_db(cassandra, tmp_path, "p.tdb", PERSISTENT)
    second = open_db(cassandra, tmp_path, "p.tdb", PERSISTENT)
    second.op_timeout = 0.5  # the lock wait only: a short open fails on a loaded Cassandra
    first.transaction_start()
    with pytest.raises(LockConflict):
        second.transaction_start(nonblock=True)
    with pytest.raises(Timeout):
        second.lock(b"x")
    first.transaction_cancel()
    second.lock(b"x")
    second.unlock(b"x")


def test_the_first_opener_starts_a_new_generation_and_later_openers_join(cassandra, tmp_path):
    first = open_db(cassandra, tmp_path)
    store(first, b"k", b"v")
    joined = open_db(cassandra, tmp_path)  # first has it open: no wipe
    assert joined.generation == first.generation and joined.get(b"k") == b"v"
    first.close()
    joined.close()
    OPENED.clear()
    again = open_db(cassandra, tmp_path)  # nobody has it open
    assert again.generation == first.generation + 1
    assert again.get(b"k") is None and list(again.scan()) == []


def test_a_traverse_pages_through_many_records(cassandra, tmp_path, monkeypatch):
    # pages of 40 rows, not the adapter's 1000: the paging is the same, and
    # 2005 records stored one locked write at a time took 48 s of the one
    # Cassandra worker in make test
    monkeypatch.setattr(cc, "PAGE_ROWS", 40)
    db = open_db(cassandra, tmp_path, flags=TDB_CLEAR_IF_FIRST)
    for i in range(2 * cc.PAGE_ROWS + 5):
        store(db, b"k%d" % i, b"v%d" % i)
    other = open_db(cassandra, tmp_path, "other.tdb", flags=TDB_CLEAR_IF_FIRST)
    store(other, b"k1", b"elsewhere")
    before = db.round_trips
    records = dict(db.scan())
    assert len(records) == 2 * cc.PAGE_ROWS + 5 and records[b"k1"] == b"v1"
    assert db.round_trips - before == 3, "three pages"


def test_a_forked_child_makes_its_own_session(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path)
    store(db, b"k", b"parent")
    parent_session = cc.session_for(db.config)
    pid = os.fork()
    if pid == 0:  # never touch the parent's session: it would wait forever
        code = 1
        try:
            db.after_fork()
            assert cc.session_for(db.config) is not parent_session
            store(db, b"k", b"child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cc.session_for(db.config) is parent_session
    assert db.get(b"k") == b"child"


def test_a_commit_killed_mid_way_is_all_or_nothing(cassandra, tmp_path):
    """Children commit 200-key transactions in a loop and are SIGKILLed at
    random moments; every transaction wrote the same generation to all keys."""
    keys = [b"key-%03d" % i for i in range(200)]
    for round_ in range(3):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                child = CassandraAdapter(DatabaseSpec(str(tmp_path / "atomic.tdb"), tdb_flags=PERSISTENT),
                                         Options(cassandra.options()))
                for n in range(1000):
                    child.transaction_start()
                    for key in keys:
                        child.put(key, b"%d-%d" % (round_, n))
                    child.transaction_commit()
                code = 0
            finally:
                os._exit(code)
        time.sleep(1.5 + round_ * 0.37)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reader = open_db(cassandra, tmp_path, "atomic.tdb", PERSISTENT, lease=1)
        values = {v for k, v in reader.scan()}
        assert len(values) <= 1, f"a partial commit: {sorted(values)[:5]}"
        time.sleep(1.1)  # the killed child's transaction lock ends with its TTL


def test_a_dead_node_fails_within_op_timeout_with_unavailable(tmp_path):
    with CassandraCluster(nodes=1) as cluster:
        db = CassandraAdapter(DatabaseSpec(str(tmp_path / "t.tdb"), tdb_flags=VOLATILE),
                              Options({**cluster.options(), "op_timeout": "2"}))
        store(db, b"k", b"v")
        cluster.stop_node(0)
        started = time.monotonic()
        with pytest.raises((Unavailable, Timeout)):
            db.get(b"k")
        assert time.monotonic() - started < 2 + 1.5
