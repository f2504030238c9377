"""rados's side of the node cache protocol (adapters/_rados_ownership) on a
real throwaway Ceph, below the node cache: node leases the OSD ends, fenced
write-backs, process locks against node takes and claims, and release
requests. The node cache on top of it: tests/python/test_node_cache.py."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.server


rados = pytest.importorskip("rados")

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec  # noqa: E402
from dbwrap_py.adapters.rados import client as rc  # noqa: E402
from dbwrap_py.adapters.rados.nodenames import node_oid, request_entry  # noqa: E402
from dbwrap_py.adapters.rados.nodestore import RadosNodeStore  # noqa: E402
from dbwrap_py.adapters.rados.adapter import RadosAdapter  # noqa: E402
from dbwrap_py.adapters.rados.ownership import RadosOwnership  # noqa: E402
from dbwrap_py.nodecache.layout import bucket_of  # noqa: E402
from dbwrap_py.nodecache.protocol import OwnedElsewhere  # noqa: E402
from dbwrap_py.options import Options  # noqa: E402
from shared_servers import PrefixedCeph  # noqa: E402

TTL = 1.5


@pytest.fixture(scope="module")
def ceph(shared_ceph: PrefixedCeph) -> PrefixedCeph:
    """The run's one-OSD Ceph, this module's objects under a prefix of their own (conftest.py)."""
    return shared_ceph


def open_db(ceph, tmp_path, **options) -> RadosAdapter:
    values = {**ceph.options(), "op_timeout": "5", **{k: str(v) for k, v in options.items()}}
    return RadosAdapter(DatabaseSpec(str(tmp_path / "locking.tdb"), tdb_flags=TDB_CLEAR_IF_FIRST),
                        Options(values))


def node_store(ceph) -> RadosNodeStore:
    return RadosAdapter.node_store(Options({**ceph.options(), "op_timeout": "5"}))


@pytest.fixture
def node(ceph, tmp_path):
    """A database, its ownership operations, and node "n" with a live lease."""
    db = open_db(ceph, tmp_path)
    store = node_store(ceph)
    lease = store.grant(b"n", 30)
    yield db, db.ownership(), store, lease
    store.revoke(lease)
    db.close()


def stored(db: RadosAdapter, key: bytes) -> bytes | None:
    """The store's copy, whoever owns the record."""
    name = "k" + rc.encode_key(key)
    return db.ops.read(db.oid_of(key), [name]).get(name)


def test_a_dead_node_lease_frees_its_records_and_fences_its_write_backs(ceph, tmp_path):
    db = open_db(ceph, tmp_path)
    own = db.ownership()
    x, y = node_store(ceph), node_store(ceph)
    lease_x, lease_y = x.grant(b"x", TTL), y.grant(b"y", 30)
    taken = own.take(b"k", b"x", lease_x.id)
    assert own.owner(b"k") == b"x"
    with pytest.raises(OwnedElsewhere) as refused:
        own.take(b"k", b"y", lease_y.id)
    assert refused.value.node == b"x"
    time.sleep(TTL + 0.5)  # x's agent "hangs": no keepalive
    assert x.keepalive(lease_x, 5) == 0.0, "an expired node lease stays dead (LOCK_MUST_RENEW)"
    assert own.owner(b"k") is None
    again = own.take(b"k", b"y", lease_y.id)  # finds x's lease gone, removes its entry
    assert again.token != taken.token
    assert not own.write_back(b"k", b"stale", taken.token, False, b"x", lease_x.id), "x is fenced"
    assert stored(db, b"k") is None
    assert own.write_back(b"k", b"fresh", again.token, False, b"y", lease_y.id)
    assert stored(db, b"k") == b"fresh" and own.owner(b"k") is None
    y.revoke(lease_y)
    db.close()


def test_a_process_lock_refuses_a_node_take_and_its_bucket_claim(node):
    db, own, store, lease = node
    db.lock(b"held")  # the adapter's own record lock, no node cache
    with pytest.raises(OwnedElsewhere) as refused:
        own.take(b"held", b"n", lease.id)
    assert refused.value.node is None, "a process holds it"
    assert own.claim(bucket_of(b"held"), b"n", lease.id) is None
    db.put_unlock(b"held", b"v")
    claim = own.claim(bucket_of(b"held"), b"n", lease.id)
    assert claim is not None and dict(claim.records) == {b"held": b"v"}
    # now the node owns the bucket: a process's lock asks the node and waits
    taken, _ = db.take_lease(b"held", 1, 1.0, read=True)
    assert not taken
    entries, _ = store.ops.page(node_oid(store.prefix, b"n"), "", "q", "test")
    assert [name for name, _ in entries] == [request_entry(db.node_cache_id, b"held")]
    # handed back (detached from the claim): the process gets it
    assert own.write_back(b"held", b"w", claim.token, True, b"n", lease.id)
    assert db.lock_get(b"held") == b"w"
    db.unlock(b"held")


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
        deadline = time.monotonic() + 0.5  # well within the 1 s poll: the notify woke it
        while len(heard) < expected:
            assert time.monotonic() < deadline, f"request {expected} not heard"
            time.sleep(0.01)
        store.done(b"n", db.node_cache_id, b"k")
    assert heard == [(db.node_cache_id, b"k")] * 2
    stop.set()
    own.request_release(b"k", b"n", 0)  # wakes the listener to see stop
    listener.join(5)


def test_a_record_handed_over_is_the_asking_nodes_and_one_a_process_asked_for_is_free(ceph, tmp_path):
    """hand_over gives the record to the node that asked (its lock, on a new
    token its take adopts), from a record lock or a bucket claim alike, and
    removes the request; a process's request leaves the record free."""
    db = open_db(ceph, tmp_path)
    own = db.ownership()
    x, y = node_store(ceph), node_store(ceph)
    lease_x, lease_y = x.grant(b"hx", 30), y.grant(b"hy", 30)

    def requests(node: bytes) -> list[str]:
        return [name for name, _ in x.ops.page(node_oid(x.prefix, node), "", "q", "test")[0]]

    held = own.take(b"k", b"hx", lease_x.id)
    claim = own.claim(bucket_of(b"c"), b"hx", lease_x.id)
    assert claim is not None and bucket_of(b"c") != bucket_of(b"k")
    for key, token, via_bucket in ((b"k", held.token, False), (b"c", claim.token, True)):
        own.request_release(key, b"hx", lease_y.id, requester=b"hy")
        assert own.hand_over(key, b"v" + key, token, via_bucket, b"hx", lease_x.id)
        assert own.owner(key) == b"hy" and stored(db, key) == b"v" + key
        assert requests(b"hx") == []
        mine = own.take(key, b"hy", lease_y.id)  # y's waiter finds the hold its own
        assert mine.value == b"v" + key and mine.token != token and not mine.via_bucket
        if not via_bucket:  # (a claim's token holds for the rest of its bucket)
            assert not own.write_back(key, b"stale", token, False, b"hx", lease_x.id), "x is fenced"
        own.request_release(key, b"hy", 0)  # a process asks
        assert own.hand_over(key, b"w", mine.token, False, b"hy", lease_y.id)
        assert own.owner(key) is None and stored(db, key) == b"w"
        assert requests(b"hy") == []
    x.revoke(lease_x)
    y.revoke(lease_y)
    db.close()


def test_a_hand_over_makes_the_record_the_askers_in_two_round_trips_and_a_dead_askers_hold_is_cleared(
        ceph, tmp_path):
    """The asker holds the record after the request's read and the fenced
    write-back (the request's removal comes after: three round trips in all,
    none of them asking the OSD for the asker's lease); a removal that fails
    does not undo the hand-over. An asker that died meanwhile holds it only
    until the next taker finds its lease gone."""
    db = open_db(ceph, tmp_path)
    own = db.ownership()
    x, y, z = node_store(ceph), node_store(ceph), node_store(ceph)
    lease_x, lease_y, lease_z = x.grant(b"tx", 30), y.grant(b"ty", 30), z.grant(b"tz", 30)
    looker = RadosOwnership(rc.Ops(own.ops.config), own.prefix, own.meta_oid, own.db_id, own.objects,
                            own.epoch, own.op_timeout)  # its round trips are not own's
    writes: list[str] = []
    send = own.ops.send

    def recording(op, oid, what):
        writes.append(f"{what}: {looker.owner(b'k')}" if what == "release request served" else what)
        return send(op, oid, what)

    held = own.take(b"k", b"tx", lease_x.id)
    own.request_release(b"k", b"tx", lease_y.id, requester=b"ty")
    own.ops.send = recording
    before = own.ops.round_trips
    assert own.hand_over(b"k", b"v", held.token, False, b"tx", lease_x.id)
    own.ops.send = send
    assert own.ops.round_trips - before == 3, "the read, the write-back, the request's removal"
    assert writes == ["hand over", "release request served: b'ty'"], "y held it before the request went"
    assert own.owner(b"k") == b"ty"

    mine = own.take(b"k", b"ty", lease_y.id)
    own.request_release(b"k", b"ty", lease_x.id, requester=b"tx")

    def failing(op, oid, what):
        if what == "release request served":
            raise rc.failed(-110, what)  # the OSD did not answer the removal
        return send(op, oid, what)

    own.ops.send = failing
    assert own.hand_over(b"k", b"v2", mine.token, False, b"ty", lease_y.id), "handed over all the same"
    own.ops.send = send
    assert own.owner(b"k") == b"tx"
    mine = own.take(b"k", b"tx", lease_x.id)
    assert mine.value == b"v2"
    own.write_back(b"k", b"v2", mine.token, False, b"tx", lease_x.id)
    mine = own.take(b"k", b"ty", lease_y.id)
    own.request_release(b"k", b"ty", lease_z.id, requester=b"tz")
    z.revoke(lease_z)  # z dies after asking
    assert own.hand_over(b"k", b"w", mine.token, False, b"ty", lease_y.id)
    assert own.owner(b"k") is None, "z's hold, of a dead lease, is nobody's"
    again = own.take(b"k", b"tx", lease_x.id)  # finds z's lease gone, removes its entry
    assert again.value == b"w"
    x.revoke(lease_x)
    y.revoke(lease_y)
    db.close()
