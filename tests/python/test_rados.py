"""The rados adapter on a real throwaway Ceph (one mon, one memstore OSD):
what the conformance suite does not see from outside: round trips, wake-ups
by notify, paging past the OSD's 1024-entry cap, atomic commits under
SIGKILL, and a dead cluster failing within op_timeout. The run's shared
Ceph, this module's objects under their own prefix (conftest.py); the
paused OSD on a Ceph of its own."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytestmark = pytest.mark.server


rados = pytest.importorskip("rados")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, TDB_SEQNUM, DatabaseSpec  # noqa: E402
from dbwrap_py.adapters.rados import client as rc  # noqa: E402
from dbwrap_py.testing.servers.rados import CephCluster  # noqa: E402
from dbwrap_py.adapters.rados.adapter import RadosAdapter  # noqa: E402
from dbwrap_py.errors import ConfigError, FencedOut, Timeout, Unavailable  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402
from shared_servers import PrefixedCeph  # noqa: E402
from lease_renewal import assert_a_transaction_reading_past_its_lease_commits, assert_renewal_keeps_the_lock  # noqa: E402

VOLATILE = TDB_CLEAR_IF_FIRST | TDB_SEQNUM


@pytest.fixture(scope="module")
def ceph(shared_ceph: PrefixedCeph) -> PrefixedCeph:
    """The run's one-OSD Ceph, this module's objects under a prefix of their own (conftest.py)."""
    return shared_ceph


OPENED: list[RadosAdapter] = []


@pytest.fixture(autouse=True)
def close_opened():
    """Close what a test opened while its cluster runs: a watch left to the
    interpreter's exit times out unwatching from a cluster that is gone."""
    yield
    while OPENED:
        OPENED.pop().close()


def open_db(ceph, tmp_path, name="t.tdb", flags=VOLATILE, **options) -> RadosAdapter:
    values = {**ceph.options(), **{k: str(v) for k, v in options.items()}}
    db = RadosAdapter(DatabaseSpec(str(tmp_path / name), tdb_flags=flags), Options(values))
    OPENED.append(db)
    return db


def test_every_byte_string_round_trips_through_the_key_encoding():
    keys = [bytes(range(256)), b"%", b"%25", b"SECRETS/MACHINE_PASSWORD/WORKGROUP", b"\xff\x00", b""]
    for key in keys:
        encoded = rc.encode_key(key)
        encoded.encode("ascii")  # omap keys must be UTF-8: ASCII is
        assert rc.decode_key(encoded) == key
    assert rc.encode_key(b"SECRETS/SID") == "SECRETS/SID"  # readable where it can be


def test_a_fractional_op_timeout_opens_with_whole_seconds_for_librados(ceph, tmp_path):
    """librados takes its timeouts in whole seconds (conf_set of 0.5 is EINVAL)."""
    db = open_db(ceph, tmp_path, op_timeout="0.5")
    db.lock(b"k")
    db.put_unlock(b"k", b"v")
    assert db.get(b"k") == b"v"
    assert dict(db.config.settings)["rados_osd_op_timeout"] == "1"


def test_a_database_keeps_the_number_of_objects_its_first_opener_chose(ceph, tmp_path):
    first = open_db(ceph, tmp_path, objects=4)
    first.lock(b"k")
    first.put_unlock(b"k", b"v")
    second = open_db(ceph, tmp_path, objects=64)  # the first has it open: no wipe
    assert second.objects == 4 and second.get(b"k") == b"v"
    with pytest.raises(ConfigError, match="at most 256"):
        open_db(ceph, tmp_path, objects=257)
    first.close()
    second.close()


def test_do_locked_is_two_round_trips_and_fetch_locked_one_more(ceph, tmp_path):
    db = open_db(ceph, tmp_path)
    before = db.round_trips
    assert db.lock_get(b"k") is None  # lock + read: pipelined, one round trip
    assert db.round_trips - before == 1
    db.put_unlock(b"k", b"v")  # assert + write + unlock: one op
    assert db.round_trips - before == 2
    db.lock(b"k")
    db.put(b"k", b"w")
    db.unlock(b"k")
    assert db.get(b"k") == b"w"


def test_a_waiter_wakes_by_notify_when_the_holder_lets_go(ceph, tmp_path):
    holder = open_db(ceph, tmp_path)
    waiter = open_db(ceph, tmp_path)
    holder.lock(b"busy")
    taken = threading.Event()
    released_at: list[float] = []

    def wait_for_it() -> None:
        waiter.lock(b"busy")
        taken.set()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    # until the waiter has its watch and has flagged itself (a fixed 0.6 s
    # sleep was too short once under load: it took the lock by its poll)
    deadline = time.monotonic() + 10
    while b"busy" not in waiter._waits.flagged and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"busy" in waiter._waits.flagged, "the waiter never flagged itself"
    assert not taken.is_set()
    released_at.append(time.monotonic())
    holder.put_unlock(b"busy", b"handed over")
    assert taken.wait(5)
    thread.join()
    oid = waiter.oid_of(b"busy")
    # the flag was set before the release, so the holder notified; the
    # waiter's retry right after flagging itself may have taken the lock
    # before that notify arrived (a helper's run saw it once), so wait for it
    deadline = time.monotonic() + 5
    while waiter._waits.generation.get(oid, 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiter._waits.generation.get(oid, 0) >= 1, "the waiter never saw a notify"
    assert waiter.get(b"busy") == b"handed over"
    waiter.unlock(b"busy")


def test_a_traverse_pages_past_the_osds_1024_entry_cap(ceph, tmp_path):
    db = open_db(ceph, tmp_path, objects=1)
    keys = [b"key-%05d" % i for i in range(2500)]
    for key in keys:
        db.lock(key)
        db.put_unlock(key, key[::-1])
    found = dict(db.scan())
    assert len(found) == 2500 and found[b"key-01234"] == b"43210-yek"


def test_an_expired_holder_cannot_write_over_the_next_one(ceph, tmp_path):
    stale = open_db(ceph, tmp_path, lease=1)
    fresh = open_db(ceph, tmp_path, lease=1)
    stale.lock(b"r")
    time.sleep(1.3)  # the OSD ends the lock
    fresh.lock(b"r")
    fresh.put(b"r", b"fresh")
    with pytest.raises(FencedOut):
        stale.put(b"r", b"stale")
    fresh.unlock(b"r")
    assert fresh.get(b"r") == b"fresh"


def test_a_renewed_lease_keeps_the_lock_past_its_time(ceph, tmp_path):
    assert_renewal_keeps_the_lock(open_db(ceph, tmp_path, lease=1),
                                  open_db(ceph, tmp_path, lease=1), contend_for=0.4)


def test_a_commit_is_all_or_nothing_when_the_client_is_killed(ceph, tmp_path):
    """SIGKILL the committing process at moments around its commit: a reader
    sees either every record of the transaction or none."""
    reader = open_db(ceph, tmp_path, "secrets.tdb", flags=0)

    def killed_after(attempt: int, delay: float) -> bool:
        """One child's commit, killed ``delay`` s after it starts: whether it landed."""
        ready, go = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            signal.alarm(30)  # a hung child ends, and the parent reads EOF
            db = open_db(ceph, tmp_path, "secrets.tdb", flags=0, lease=1)
            db.transaction_start()  # waits out a killed predecessor's lock (1 s)
            for i in range(300):
                db.lock(b"k%d" % i)
                db.put_unlock(b"k%d" % i, b"round %d" % attempt)
            os.write(go, b"c")
            db.transaction_commit()
            os._exit(0)
        os.close(go)
        about_to_commit = os.read(ready, 1)
        os.close(ready)
        assert about_to_commit == b"c", f"attempt {attempt}: the child died before its commit"
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        got = sum(1 for _, v in reader.scan() if v == b"round %d" % attempt)
        assert got in (0, 300), f"attempt {attempt}: {got} of 300 records committed"
        return got == 300

    # from before the op leaves to after it lands; a loaded machine commits
    # slower, so while every kill came first the delay doubles (at most 2 s)
    committed = [killed_after(attempt, 0.0003 * attempt) for attempt in range(12)]
    for attempt, delay in enumerate((0.008 * 2 ** k for k in range(9)), start=12):
        if True in committed:
            break
        committed.append(killed_after(attempt, delay))
    assert True in committed and False in committed, f"kills all landed on one side: {committed}"


def test_a_transaction_that_outlives_its_lease_while_it_reads_still_commits(ceph, tmp_path):
    """The transaction lock is renewed as the transaction works (lease_renewal.py says why)."""
    assert_a_transaction_reading_past_its_lease_commits(open_db(ceph, tmp_path, "long.tdb", flags=0, lease=2))


def test_a_record_lock_in_a_persistent_database_waits_for_a_transaction(ceph, tmp_path):
    txn = open_db(ceph, tmp_path, "p.tdb", flags=0)
    other = open_db(ceph, tmp_path, "p.tdb", flags=0)
    txn.transaction_start()
    txn.lock(b"k")
    txn.put_unlock(b"k", b"in-txn")  # buffered until the commit
    got: dict[str, object] = {}

    def lock_it() -> None:
        got["value"] = other.lock_get(b"k")
        got["at"] = time.monotonic()
        other.unlock(b"k")

    locker = threading.Thread(target=lock_it)
    locker.start()
    time.sleep(0.6)
    assert locker.is_alive(), "the record lock did not wait for the transaction"
    committed = time.monotonic()
    txn.transaction_commit()
    locker.join(10)
    assert got["value"] == b"in-txn" and got["at"] >= committed


def test_a_paused_osd_fails_calls_within_op_timeout_and_they_work_again(tmp_path):
    with CephCluster(osds=1) as cluster:
        db = RadosAdapter(DatabaseSpec(str(tmp_path / "p.tdb"), tdb_flags=VOLATILE),
                          Options({**cluster.options(), "op_timeout": "2"}))
        db.lock(b"x")
        db.put_unlock(b"x", b"1")
        cluster.pause_daemon("osd.0")
        try:
            start = time.monotonic()
            with pytest.raises((Timeout, Unavailable)):
                db.get(b"x")
            assert time.monotonic() - start < 4
        finally:
            cluster.resume_daemon("osd.0")
        assert db.get(b"x") == b"1"
        db.close()  # its watches, while the cluster is there to end them


def test_forked_children_connect_with_addresses_of_their_own(ceph, tmp_path):
    """Ceph draws a client's messenger nonce from a per-thread random engine
    that fork copies: children connecting from their main thread shared one
    address, and the OSD mistook each for the other reconnecting."""
    db = open_db(ceph, tmp_path)
    parent_address = rc.CLIENTS.by_config[db.config][0].get_addrs()
    readers = []
    for _ in range(3):
        read_end, write_end = os.pipe()
        if os.fork() == 0:  # pragma: no cover - the child
            signal.alarm(30)  # a hung child ends, and the parent reads EOF
            db.get(b"any")  # connects this process's client
            os.write(write_end, rc.CLIENTS.by_config[db.config][0].get_addrs().encode())
            os._exit(0)
        os.close(write_end)
        readers.append(read_end)
    addresses = {os.read(r, 200).decode() for r in readers}
    for _ in readers:
        os.wait()
    assert len(addresses) == 3 and parent_address not in addresses, addresses


def test_a_child_never_frees_the_parents_watches(ceph, tmp_path):
    """An adapter with watches is cyclic garbage when it is dropped; the
    cycle collector running in a forked child must not free its inherited
    Watch (that unwatches through the parent's client and hangs)."""
    import gc

    gc.disable()  # the garbage must outlive the fork
    try:
        holder, waiter = open_db(ceph, tmp_path), open_db(ceph, tmp_path)
        holder.lock(b"w")
        waiter._watch(waiter.oid_of(b"w"))  # a watch whose callback refers back to the adapter
        holder.unlock(b"w")
        del holder, waiter
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            signal.alarm(20)
            gc.collect()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        gc.enable()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status} (hung?)"


def test_a_dropped_volatile_database_is_freed_at_once(ceph, tmp_path):
    """Its opener registration (dbwrap_py.openers, openers.py) makes no
    reference cycle: a dropped adapter's opener watch closes then, not
    whenever the cycle collector runs (with the cluster gone, it timed out
    unwatching)."""
    import gc
    import weakref

    gc.disable()
    try:
        db = open_db(ceph, tmp_path)
        OPENED.remove(db)
        dropped = weakref.ref(db)
        del db
        assert dropped() is None, "the adapter is cyclic garbage"
    finally:
        gc.enable()
