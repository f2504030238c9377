"""fdb's side of the node cache protocol (adapters/_fdb_ownership), below the
node cache, on the model of FoundationDB (``fdb_library = model``): results
of ``fdb (model)``, not of FoundationDB. Node leases judged in read versions,
fenced write-backs, process locks against node takes and claims, release
requests heard by a watch on the node's doorbell (and heard gone when
served), hand-overs to the asking node, and tokens across a wipe.
The node cache on top of it: tests/python/test_node_cache.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec
from dbwrap_py.adapters.fdb.nodestore import FdbNodeStore
from dbwrap_py.adapters.fdb.adapter import FdbAdapter
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.protocol import OwnedElsewhere, Served
from dbwrap_py.options import Options
from dbwrap_py.testing.fdb_model.throwaway import model_server

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def cluster_file():
    with model_server() as path:
        yield path


def options(cluster_file: Path, **more: str) -> dict[str, str]:
    return {"fdb_library": "model", "cluster_file": str(cluster_file), "op_timeout": "5", **more}


def open_db(cluster_file: Path, path: Path, **more: str) -> FdbAdapter:
    return FdbAdapter(DatabaseSpec(str(path), tdb_flags=TDB_CLEAR_IF_FIRST, open_flags=os.O_RDWR | os.O_CREAT),
                      Options(options(cluster_file, **more)))


def node_store(cluster_file: Path) -> FdbNodeStore:
    return FdbAdapter.node_store(Options(options(cluster_file)))


@pytest.fixture
def node(cluster_file, tmp_path):
    """A database, its ownership operations, and node "n" with a live lease."""
    db = open_db(cluster_file, tmp_path / "locking.tdb")
    store = node_store(cluster_file)
    lease = store.grant(b"n", 30)
    yield db, db.ownership(), store, lease
    store.revoke(lease)
    store.close()
    db.close()


def same_bucket(count: int) -> list[bytes]:
    keys = [b"k%d" % i for i in range(5000)]
    first = bucket_of(keys[0])
    return [k for k in keys if bucket_of(k) == first][:count]


def test_a_dead_node_lease_frees_its_records_and_fences_its_write_backs(cluster_file, tmp_path):
    db = open_db(cluster_file, tmp_path / "locking.tdb")
    own = db.ownership()
    store = node_store(cluster_file)
    short = store.grant(b"short", 0.5)  # never kept alive
    taken = own.take(b"k", b"short", short.id)
    other = store.grant(b"other", 30)
    with pytest.raises(OwnedElsewhere) as held:
        own.take(b"k", b"other", other.id)
    assert held.value.node == b"short"
    time.sleep(0.8)  # in read versions: the model's advance about 1,000,000 a second
    assert own.take(b"k", b"other", other.id).token > taken.token
    assert not own.write_back(b"k", b"stale", taken.token, False, b"short", short.id)
    assert store.keepalive(short, 1.0) == 0, "a lease taken over from cannot be revived"
    assert own.write_back(b"k", b"fresh", own.take(b"k", b"other", other.id).token, False, b"other", other.id)
    assert db.get(b"k") == b"fresh"
    store.revoke(other)
    store.close()
    db.close()


def test_a_live_keepalive_keeps_the_lease_and_the_name(cluster_file, tmp_path):
    db = open_db(cluster_file, tmp_path / "locking.tdb")
    own = db.ownership()
    store = node_store(cluster_file)
    lease = store.grant(b"kept", 0.6)
    own.take(b"k", b"kept", lease.id)
    other = store.grant(b"other2", 30)  # each test its own names: a live lease keeps its name
    for _ in range(8):  # 1.6 s, well past the 0.6 s it was granted
        time.sleep(0.2)
        assert store.keepalive(lease, 1.0) == 0.6
    with pytest.raises(OwnedElsewhere):
        own.take(b"k", b"other2", other.id)
    second = node_store(cluster_file)
    second.op_timeout = 0.1
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(0.15):
            store.keepalive(lease, 1.0)

    keeper = threading.Thread(target=keep, daemon=True)
    keeper.start()
    try:
        with pytest.raises(Exception, match="live agent"):
            second.grant(b"kept", 0.6)  # the name is in use while its lease lives
    finally:
        stop.set()
        keeper.join()
    second.close()
    store.revoke(other)
    store.close()
    db.close()


def test_a_process_lock_refuses_a_node_take_and_its_bucket_claim(node):
    db, own, _, lease = node
    key = same_bucket(1)[0]
    db.lock(key)
    with pytest.raises(OwnedElsewhere) as held:
        own.take(key, b"n", lease.id)
    assert held.value.node is None, "a process, not a node"
    assert own.claim(bucket_of(key), b"n", lease.id) is None
    db.unlock(key)
    claim = own.claim(bucket_of(key), b"n", lease.id)
    assert claim is not None
    assert own.owner(key) == b"n"


def test_a_claim_makes_a_process_lock_wait_and_ask_the_node(node):
    db, own, store, lease = node
    key = same_bucket(1)[0]
    db.lock(key)
    db.put(key, b"v")
    db.unlock(key)
    claim = own.claim(bucket_of(key), b"n", lease.id)
    assert claim is not None and claim.records == {key: b"v"}
    heard: list[tuple[bytes, bytes]] = []
    stop = threading.Event()
    listener = threading.Thread(target=lambda: heard.extend(store.requests(b"n", stop)), daemon=True)
    listener.start()
    got = []
    locker = threading.Thread(target=lambda: got.append(db.lock_get(key)), daemon=True)
    locker.start()
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        time.sleep(0.02)
    assert heard and heard[0] == (db.node_cache_id, key), "the process asked the owning node"
    assert locker.is_alive(), "the process waits while the node owns the record"
    assert own.write_back(key, b"from the node", claim.token, True, b"n", lease.id)  # detached
    locker.join(5)
    assert got == [b"from the node"]
    db.unlock(key)
    stop.set()
    listener.join(5)


def test_requests_arrive_by_the_doorbell_watch_not_by_polling(node):
    db, own, store, lease = node
    heard: list[tuple[float, tuple[bytes, bytes]]] = []
    stop = threading.Event()

    def listen() -> None:
        for request in store.requests(b"n", stop):
            heard.append((time.monotonic(), request))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    time.sleep(0.3)
    idle_before = store.shared.round_trips
    time.sleep(2.0)
    idle = store.shared.round_trips - idle_before
    assert idle == 0, f"{idle} transactions in 2 s with no request: polling"
    asked = time.monotonic()
    own.request_release(b"k", b"n", lease.id)
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        time.sleep(0.01)
    assert heard and heard[0][1] == (db.node_cache_id, b"k")
    assert heard[0][0] - asked < 0.3, f"heard {heard[0][0] - asked:.2f} s after the request"
    store.done(b"n", db.node_cache_id, b"k")
    while len(heard) < 2 and time.monotonic() < deadline:  # done() rings the doorbell too
        time.sleep(0.01)
    own.request_release(b"k", b"n", lease.id)  # asked again after it was served: heard again
    while len(heard) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r for _, r in heard] == [(db.node_cache_id, b"k"), Served(db.node_cache_id, b"k"),
                                     (db.node_cache_id, b"k")]
    stop.set()
    listener.join(5)


def test_a_hand_over_makes_the_record_the_asking_nodes_with_a_new_token(node, cluster_file):
    """Node m asks node n for a record: n's hand-over writes it back and, in
    the same transaction, puts m's record lock on it with a token of its own,
    so nobody takes it in between and m's next take adopts it. A process's
    request, a requester whose lease is gone, or a token that no longer holds
    leave it as write_back would."""
    db, own, store, lease = node
    other = store.grant(b"m", 30)
    held = own.take(b"h", b"n", lease.id)
    own.request_release(b"h", b"n", other.id, requester=b"m")
    assert own.hand_over(b"h", b"v1", held.token, False, b"n", lease.id)
    assert own.owner(b"h") == b"m", "the record is the asking node's"
    assert not own.request_waiting(b"h", b"n", other.id), "the request went in the hand-over"
    assert not own.write_back(b"h", b"stale", held.token, False, b"n", lease.id), "n's token is void"
    adopted = own.take(b"h", b"m", other.id)
    assert adopted.value == b"v1" and adopted.token > held.token
    assert own.take(b"h", b"m", other.id).token == adopted.token, "m's own hold, adopted again"

    key = same_bucket(1)[0]  # out of a bucket claim: detached, then m's
    claim = own.claim(bucket_of(key), b"n", lease.id)
    assert claim is not None
    own.request_release(key, b"n", other.id, requester=b"m")
    assert own.hand_over(key, b"v2", claim.token, True, b"n", lease.id)
    assert own.owner(key) == b"m"
    assert own.take(key, b"m", other.id).value == b"v2"
    with pytest.raises(OwnedElsewhere):
        own.take(same_bucket(2)[1], b"m", other.id)  # the rest of the bucket is still n's

    process = own.take(b"p", b"n", lease.id)  # a process asks (store.py asks with lease 0, no name)
    own.request_release(b"p", b"n", 0)
    assert own.hand_over(b"p", b"v3", process.token, False, b"n", lease.id)
    assert own.owner(b"p") is None and db.get(b"p") == b"v3"

    gone = store.grant(b"gone", 30)
    dead = own.take(b"d", b"n", lease.id)
    own.request_release(b"d", b"n", gone.id, requester=b"gone")
    store.revoke(gone)
    assert own.hand_over(b"d", b"v4", dead.token, False, b"n", lease.id)
    assert own.owner(b"d") is None, "no lock on a lease that is not live"

    late = own.take(b"f", b"n", lease.id)
    own.request_release(b"f", b"n", other.id, requester=b"m")
    assert own.write_back(b"f", b"v5", late.token, False, b"n", lease.id)
    own.request_release(b"f", b"n", other.id, requester=b"m")
    assert not own.hand_over(b"f", b"v6", late.token, False, b"n", lease.id), "fenced: nothing written"
    assert own.owner(b"f") is None and db.get(b"f") == b"v5"
    store.revoke(other)


def test_a_served_request_is_heard_gone_by_the_doorbell(node):
    """A write-back, a hand-over or the agent's done() that removes a request
    rings the owner's doorbell, so its agent's requests yield Served within
    a round trip or two, not at the next request."""
    db, own, store, lease = node
    other = store.grant(b"m2", 30)
    heard: list[tuple[float, object]] = []
    stop = threading.Event()

    def listen() -> None:
        for request in store.requests(b"n", stop):
            if request in ((db.node_cache_id, b"s"), Served(db.node_cache_id, b"s")):  # not other tests' "n"
                heard.append((time.monotonic(), request))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()

    def next_heard(count: int) -> tuple[float, object]:
        deadline = time.monotonic() + 5
        while len(heard) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(heard) >= count, f"heard {[r for _, r in heard]}"
        return heard[count - 1]

    db_id = db.node_cache_id
    serves = [lambda token: own.write_back(b"s", b"v", token, False, b"n", lease.id),
              lambda token: own.hand_over(b"s", b"v", token, False, b"n", lease.id),
              lambda token: store.done(b"n", db_id, b"s")]
    try:
        for i, serve in enumerate(serves):
            token = own.take(b"s", b"n", lease.id).token
            own.request_release(b"s", b"n", other.id, requester=b"m2")
            assert next_heard(2 * i + 1)[1] == (db_id, b"s")
            served = time.monotonic()
            serve(token)
            at, what = next_heard(2 * i + 2)
            assert what == Served(db_id, b"s")
            assert at - served < 0.3, f"heard gone {at - served:.2f} s after it was served"
            own.let_go(b"s", b"n", lease.id)
            if own.owner(b"s") == b"m2":
                own.let_go(b"s", b"m2", other.id)
    finally:
        stop.set()
        listener.join(5)
        store.revoke(other)


def test_release_bucket_writes_back_in_parts_and_is_fenced_on_its_token(node):
    db, own, _, lease = node
    keys = same_bucket(3)
    claim = own.claim(bucket_of(keys[0]), b"n", lease.id)
    assert claim is not None
    big = {key: key * (1_900_000 // len(key)) for key in keys}  # 5.7 MB: over one part
    assert not own.release_bucket(bucket_of(keys[0]), claim.token + 1, big)
    assert all(db.store().get(key) == (None, True) for key in keys), "a wrong token wrote nothing"
    assert own.release_bucket(bucket_of(keys[0]), claim.token, big)
    assert {key: db.get(key) for key in keys} == big
    assert own.owner(keys[0]) is None


def test_a_first_opener_wipe_voids_every_token_before_it(cluster_file, tmp_path):
    store = node_store(cluster_file)
    lease = store.grant(b"w", 30)
    db = open_db(cluster_file, tmp_path / "wiped.tdb")
    before = db.ownership().take(b"k", b"w", lease.id).token
    db.close()
    again = open_db(cluster_file, tmp_path / "wiped.tdb")  # nobody has it open: wiped
    assert again.wipe_revision >= before
    after = again.ownership().take(b"k", b"w", lease.id)
    assert after.token > again.wipe_revision
    assert again.ownership().owner(b"k") == b"w"
    store.revoke(lease)
    store.close()
    again.close()


def test_a_keepalive_that_read_before_a_takeover_cannot_commit_after_it(cluster_file, tmp_path):
    """The race a read-version lease has: a keepalive reads the lease while it
    is live, the lease runs out, another node takes a record over, then the
    keepalive commits. It must not: the takeover cleared the lease key, which
    the keepalive read, so the keepalive conflicts (1020) and its retry finds
    no lease to renew."""
    import struct

    import dbwrap_py.testing.fdb_model as fdb_model

    db = open_db(cluster_file, tmp_path / "locking.tdb")
    own = db.ownership()
    store = node_store(cluster_file)
    short = store.grant(b"racer", 0.4)
    own.take(b"k", b"racer", short.id)
    lease_key = store.shared.nodes.lease(b"racer")
    keepalive = fdb_model.open(str(cluster_file)).create_transaction()
    seen = keepalive.get(lease_key).wait()  # live now: the keepalive would renew it
    assert struct.unpack(">qq", seen.value)[1] > keepalive.get_read_version().wait()
    time.sleep(0.6)
    other = store.grant(b"taker", 30)
    own.take(b"k", b"taker", other.id)  # the racer's lease ran out: taken over
    keepalive.set(lease_key, struct.pack(">qq", short.id, 2**62))
    with pytest.raises(fdb_model.FDBError) as conflict:
        keepalive.commit().wait()
    assert conflict.value.code == 1020
    assert store.keepalive(short, 1.0) == 0
    store.revoke(other)
    store.close()
    db.close()


def test_a_write_back_a_claim_and_a_release_that_landed_before_an_unknown_result_succeed(cluster_file, node):
    """1021 on a commit that applied: the retry finds the ownership let go
    (by that very commit) and must not call it fenced: the receipt tells."""
    from dbwrap_py.testing.fdb_model import Control

    db, own, store, lease = node
    control = Control(str(cluster_file))
    try:
        taken = own.take(b"w", b"n", lease.id)
        control.inject("unknown", 1, "applied")
        assert own.write_back(b"w", b"v", taken.token, False, b"n", lease.id)
        assert db.get(b"w") == b"v"
        key = same_bucket(1)[0]
        control.inject("unknown", 1, "applied")
        claim = own.claim(bucket_of(key), b"n", lease.id)
        assert claim is not None, "a claim that landed before its 1021 is ours"
        control.inject("unknown", 1, "applied")
        assert own.release_bucket(bucket_of(key), claim.token, {key: b"released"})
        assert db.get(key) == b"released"
    finally:
        control.close()
