"""cassandra's side of the node cache protocol (adapters/_cassandra_ownership)
on a real throwaway Cassandra (one node), below the node cache: node leases
Cassandra's TTL ends, fenced write-backs, process locks against node takes
and claims, release requests, and the layout and tokens across a wipe. The
node cache on top of it: tests/python/test_node_cache.py."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("cassandra")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec  # noqa: E402
from dbwrap_py.adapters.cassandra.nodestore import CassandraNodeStore  # noqa: E402
from dbwrap_py.adapters.cassandra.ownership import generation_of  # noqa: E402
from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter  # noqa: E402
from dbwrap_py.errors import ConfigError  # noqa: E402
from dbwrap_py.nodecache.layout import bucket_of  # noqa: E402
from dbwrap_py.nodecache.protocol import OwnedElsewhere  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402


pytestmark = pytest.mark.server

#: the shortest node lease: Cassandra's TTLs are whole seconds
TTL = 2


@pytest.fixture(scope="module")
def cassandra(shared_cassandra):
    """The run's one-node Cassandra, in this module's keyspace (conftest.py)."""
    return shared_cassandra


def open_db(cassandra, tmp_path, **options) -> CassandraAdapter:
    values = {**cassandra.options(), "op_timeout": "5", "layout": "buckets",
              **{k: str(v) for k, v in options.items()}}
    return CassandraAdapter(DatabaseSpec(str(tmp_path / "locking.tdb"), tdb_flags=TDB_CLEAR_IF_FIRST),
                            Options(values))


def node_store(cassandra, **options) -> CassandraNodeStore:
    return CassandraAdapter.node_store(Options({**cassandra.options(), "op_timeout": "5", **options}))


@pytest.fixture
def node(cassandra, tmp_path):
    """A database, its ownership operations, and node "n" with a live lease."""
    db = open_db(cassandra, tmp_path)
    store = node_store(cassandra)
    lease = store.grant(b"n", 30)
    yield db, db.ownership(), store, lease
    store.revoke(lease)
    db.close()


def stored(db: CassandraAdapter, key: bytes) -> bytes | None:
    """The store's copy, whoever owns the record."""
    rows = db.client.run("test", f"SELECT v FROM {db.config.keyspace}.node_volatile "
                         "WHERE db = ? AND bucket = ? AND k = ?", (db.db, bucket_of(key), b"/" + key))
    return rows[0].v if rows else None


def requests_to(store: CassandraNodeStore, node: bytes) -> list[tuple[str, bytes]]:
    rows = store.client.run("test", f"SELECT db, k FROM {store.config.keyspace}.requests WHERE node = ?",
                            (node.decode(),))
    return [(r.db, r.k[1:]) for r in rows]


def test_a_dead_node_lease_frees_its_records_and_fences_its_write_backs(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path)
    own = db.ownership()
    x, y = node_store(cassandra), node_store(cassandra)
    lease_x, lease_y = x.grant(b"x", TTL), y.grant(b"y", 30)
    assert lease_x.ttl == TTL - 1, "a whole-second TTL may end a second early: granted one less"
    taken = own.take(b"k", b"x", lease_x.id)
    assert own.owner(b"k") == b"x"
    with pytest.raises(OwnedElsewhere) as refused:
        own.take(b"k", b"y", lease_y.id)
    assert refused.value.node == b"x"
    with pytest.raises(Exception, match="live agent"):
        node_store(cassandra, op_timeout="0.5").grant(b"y", TTL)  # the name is taken while y lives
    time.sleep(TTL + 0.5)  # x's agent "hangs": no keepalive
    assert x.keepalive(lease_x, 5) == 0.0, "an expired node lease stays dead"
    assert own.owner(b"k") is None
    again = own.take(b"k", b"y", lease_y.id)  # finds x's lease gone, removes its entry
    assert again.token != taken.token
    assert not own.write_back(b"k", b"stale", taken.token, False, b"x", lease_x.id), "x is fenced"
    assert not own.write_through(b"k", b"stale", taken.token, False), "x is fenced"
    assert stored(db, b"k") is None
    assert own.write_back(b"k", b"fresh", again.token, False, b"y", lease_y.id)
    assert stored(db, b"k") == b"fresh" and own.owner(b"k") is None
    y.revoke(lease_y)
    db.close()


def test_a_live_keepalive_keeps_the_lease(cassandra):
    store = node_store(cassandra)
    lease = store.grant(b"kept", TTL)
    for _ in range(4):  # past two TTLs in all
        time.sleep(TTL / 3)
        assert store.keepalive(lease, 5) == TTL - 1
    store.revoke(lease)
    again = node_store(cassandra).grant(b"kept", TTL)  # revoked: the name is free at once
    assert again.id != lease.id


def test_a_process_lock_refuses_a_node_take_and_its_bucket_claim(node):
    db, own, store, lease = node
    db.lock(b"held")  # the adapter's own record lock, in the same partition
    with pytest.raises(OwnedElsewhere) as refused:
        own.take(b"held", b"n", lease.id)
    assert refused.value.node is None, "a process holds it"
    assert own.claim(bucket_of(b"held"), b"n", lease.id) is None
    db.put_unlock(b"held", b"v")
    claim = own.claim(bucket_of(b"held"), b"n", lease.id)
    assert claim is not None and dict(claim.records) == {b"held": b"v"}
    assert own.owner(b"held") == b"n"
    assert own.take(b"held", b"n", lease.id).via_bucket, "the node's own bucket"
    # now the node owns the bucket: a process's lock asks the node and waits
    taken, _ = db.take_lease(b"held", 1, 1.0, read=True)
    assert not taken
    assert requests_to(store, b"n") == [(db.node_cache_id.decode(), b"held")]
    # handed back (detached from the claim): the process gets it
    assert own.write_back(b"held", b"w", claim.token, True, b"n", lease.id)
    assert requests_to(store, b"n") == [], "the write-back removed the request"
    assert not own.write_back(b"held", b"again", claim.token, True, b"n", lease.id), "detached once"
    assert db.lock_get(b"held") == b"w"
    db.unlock(b"held")
    assert own.owner(b"held") is None


def test_a_node_lock_refuses_a_claim_and_another_node(node, cassandra):
    db, own, store, lease = node
    other = node_store(cassandra)
    other_lease = other.grant(b"m", 30)
    taken = own.take(b"rec", b"n", lease.id)
    assert own.claim(bucket_of(b"rec"), b"m", other_lease.id) is None, "a node's record lock is in the bucket"
    with pytest.raises(OwnedElsewhere) as refused:
        own.take(b"rec", b"m", other_lease.id)
    assert refused.value.node == b"n"
    again = own.take(b"rec", b"n", lease.id)  # a taker of ours died before keeping it
    assert again.token == taken.token and not again.via_bucket
    own.let_go(b"rec", b"n", lease.id)
    assert own.owner(b"rec") is None
    assert own.take(b"rec", b"m", other_lease.id).value is None
    other.revoke(other_lease)


def test_release_bucket_writes_back_and_frees_it_fenced_on_its_token(node):
    db, own, store, lease = node
    bucket = bucket_of(b"a")
    keys = [k for k in (b"a", *(b"k%d" % i for i in range(2000))) if bucket_of(k) == bucket][:3]
    db.lock(keys[2])
    db.put_unlock(keys[2], b"gone soon")
    claim = own.claim(bucket, b"n", lease.id)
    assert claim is not None
    assert not own.release_bucket(bucket, claim.token + 1, {keys[0]: b"x"}), "another token"
    assert own.release_bucket(bucket, claim.token, {keys[0]: b"0", keys[1]: b"1", keys[2]: None})
    assert [stored(db, k) for k in keys] == [b"0", b"1", None]
    assert own.owner(keys[0]) is None
    assert not own.release_bucket(bucket, claim.token, {keys[0]: b"late"}), "released once"
    assert stored(db, keys[0]) == b"0"
    assert dict(db.scan()) == {keys[0]: b"0", keys[1]: b"1"}


def test_a_request_made_again_after_it_was_served_is_heard_again(node):
    db, own, store, _ = node
    heard: list[tuple[bytes, bytes]] = []
    stop = threading.Event()

    def listen() -> None:
        for request in store.requests(b"n", stop):
            heard.append(request)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    for expected in (1, 2):
        own.request_release(b"k", b"n", 0)
        deadline = time.monotonic() + 1.0
        while len(heard) < expected:
            assert time.monotonic() < deadline, f"request {expected} not heard"
            time.sleep(0.01)
        store.done(b"n", db.node_cache_id, b"k")
    assert heard == [(db.node_cache_id, b"k")] * 2
    stop.set()
    listener.join(5)
    assert not listener.is_alive()


def lock_on(db: CassandraAdapter, key: bytes) -> tuple[int | None, str | None]:
    """The node record lock on ``key``: its token and holder."""
    rows = db.client.run("test", f"SELECT held, holder FROM {db.config.keyspace}.node_volatile "
                         "WHERE db = ? AND bucket = ? AND k = ?", (db.db, bucket_of(key), b"/" + key))
    return (rows[0].held, rows[0].holder) if rows else (None, None)


def test_a_record_handed_over_is_the_asking_nodes_in_the_write_backs_lwt(node, cassandra):
    """hand_over: the write-back puts the asking node's record lock, a new
    token, in the same LWT; that node's take adopts it, the holder's is
    refused; the request is gone. Held by a record lock and by the bucket."""
    db, own, store, lease = node
    other = node_store(cassandra)
    m = other.grant(b"m", 30)
    taken = own.take(b"k", b"n", lease.id)
    claim = own.claim(bucket_of(b"b"), b"n", lease.id)
    assert claim is not None and bucket_of(b"b") != bucket_of(b"k")
    for key, token, via_bucket in ((b"k", taken.token, False), (b"b", claim.token, True)):
        own.request_release(key, b"n", m.id, requester=b"m")
        assert own.hand_over(key, b"v", token, via_bucket, b"n", lease.id)
        assert requests_to(store, b"n") == [], "the hand-over removed the request"
        assert own.owner(key) == b"m" and stored(db, key) == b"v"
        with pytest.raises(OwnedElsewhere) as refused:
            own.take(key, b"n", lease.id)
        assert refused.value.node == b"m", "the holder cannot take it back"
        adopted = own.take(key, b"m", m.id)
        assert adopted.value == b"v" and adopted.token not in (token, None) and not adopted.via_bucket
        assert not own.hand_over(key, b"stale", token, via_bucket, b"n", lease.id), "n is fenced"
        assert own.write_back(key, b"w", adopted.token, False, b"m", m.id)
        assert stored(db, key) == b"w" and own.owner(key) is None
    other.revoke(m)


def test_a_hand_over_leaves_the_record_free_unless_a_live_node_asked(node, cassandra):
    """A process's request, or a node's whose lease ended, gets a plain
    write-back. A request made again while the hand-over ran (the asking
    node asks again as it waits) goes with the one it read."""
    db, own, store, lease = node
    other = node_store(cassandra)
    m = other.grant(b"m", 30)
    taken = own.take(b"p", b"n", lease.id)
    own.request_release(b"p", b"n", 0)  # a process's
    assert own.hand_over(b"p", b"1", taken.token, False, b"n", lease.id)
    assert lock_on(db, b"p") == (None, None) and stored(db, b"p") == b"1"
    assert requests_to(store, b"n") == []

    taken = own.take(b"again", b"n", lease.id)
    own.request_release(b"again", b"n", m.id, requester=b"m")

    def made_again(what: str) -> bool:  # just before the hand-over's LWT, after it read the request
        if what == "hand over":
            own.request_release(b"again", b"n", m.id, requester=b"m")
        return False

    own.client.fault = made_again
    try:
        assert own.hand_over(b"again", b"2", taken.token, False, b"n", lease.id)
    finally:
        own.client.fault = None
    assert own.owner(b"again") == b"m" and requests_to(store, b"n") == []

    taken = own.take(b"d", b"n", lease.id)
    own.request_release(b"d", b"n", m.id, requester=b"m")
    other.revoke(m)  # m's lease ends before n hands the record over
    assert own.hand_over(b"d", b"3", taken.token, False, b"n", lease.id)
    assert lock_on(db, b"d") == (None, None), "no lock left on a dead lease"
    assert stored(db, b"d") == b"3" and requests_to(store, b"n") == []


def test_the_first_opener_chooses_the_layout_and_a_wipe_voids_the_tokens(cassandra, tmp_path):
    first = open_db(cassandra, tmp_path)
    follower = open_db(cassandra, tmp_path, layout="records")  # not first: the stored layout stands
    assert follower.layout == "buckets" and follower.buckets
    store = node_store(cassandra)
    lease = store.grant(b"w", 30)
    before = first.ownership().take(b"k", b"w", lease.id).token
    assert before > first.wipe_revision
    first.close()
    follower.close()
    wiped = open_db(cassandra, tmp_path, layout="records")  # nobody has it open: a new generation
    assert wiped.generation == first.generation + 1 and wiped.layout == "records"
    assert before <= wiped.wipe_revision < (wiped.generation << 40)
    with pytest.raises(ConfigError, match="layout"):
        wiped.ownership()
    wiped.close()
    again = open_db(cassandra, tmp_path)
    token = again.ownership().take(b"k", b"w", lease.id).token
    assert token > again.wipe_revision and generation_of(token) == again.generation
    assert again.ownership().take(b"k2", b"w", lease.id).value is None
    store.revoke(lease)
    again.close()


def test_a_process_lock_waits_for_a_live_claim_and_settles_a_dead_one(cassandra, tmp_path):
    db = open_db(cassandra, tmp_path, op_timeout="8")
    own = db.ownership()
    x = node_store(cassandra)
    lease = x.grant(b"x", TTL)
    claim = own.claim(bucket_of(b"k"), b"x", lease.id)
    assert claim is not None
    started = time.monotonic()
    db.lock(b"k")  # x's lease ends (no keepalive): the process removes its claim and locks
    waited = time.monotonic() - started
    assert 0.5 < waited < TTL + 1.5, f"locked after {waited:.2f} s"
    assert requests_to(x, b"x"), "the process asked x while x lived"
    db.put_unlock(b"k", b"v")
    assert not own.release_bucket(bucket_of(b"k"), claim.token, {b"k": b"x's"}), "x is fenced"
    assert db.get(b"k") == b"v"
    db.close()


def test_a_keyspace_made_before_the_hand_over_gets_its_column_on_the_next_open(cassandra):
    """A requests table from before ``requester`` (an older release's) is
    given the column by the next ensure, and ensuring again, as every
    process does, changes nothing; a node's request then names its node."""
    from dbwrap_py.adapters.cassandra import client as cc, schema
    from dbwrap_py.adapters.cassandra.nodecql import holder

    keyspace = f"{cassandra.keyspace}_old"
    config = cc.ClientConfig.from_options(Options({**cassandra.options(), "keyspace": keyspace}), 5.0)
    session = cc.session_for(config).session
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
    session.execute(f"CREATE TABLE {keyspace}.requests (node text, db text, k blob, asked bigint, "
                    "PRIMARY KEY (node, db, k))", timeout=60)
    try:
        schema.ensure(config)
        again: set[cc.ClientConfig] = set()  # another process: its own set, the column already there
        cc.ensure_schema(config, schema.SCHEMA, again, schema.ADDED_COLUMNS)
        assert "requester" in cc._columns(session, keyspace, "requests", 60), (
            "the older requests table was not given its requester column")
        store = node_store(cassandra, keyspace=keyspace)
        db = CassandraAdapter(DatabaseSpec("/nonexistent/locking.tdb", tdb_flags=TDB_CLEAR_IF_FIRST),
                              Options({**cassandra.options(), "keyspace": keyspace, "op_timeout": "5",
                                       "layout": "buckets"}))
        try:
            lease = store.grant(b"asker", 30)
            db.ownership().request_release(b"k", b"holder", lease.id, requester=b"asker")
            rows = session.execute(f"SELECT requester FROM {keyspace}.requests", timeout=60)
            assert [row.requester for row in rows] == [holder(b"asker", lease.id)]
            store.revoke(lease)
        finally:
            db.close()
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
