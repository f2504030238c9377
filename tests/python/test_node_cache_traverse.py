"""A write-back node cache's traverse sees every node's records (nodecache/sync.py).

Two "nodes" on one host, as in test_node_cache: two node agents on one
store, a process on node A or B by the node_cache_dir it opens with. On
every adapter of the node cache: etcd, sqlite_leased, fdb (model), rados
(a throwaway Ceph), zookeeper (a throwaway server) and cassandra (a throwaway Cassandra; heavy: run its
parameter alone, ``-k cassandra``).
"""

from __future__ import annotations

import signal
import time

import pytest

from dbwrap_py.adapters.fdb.ownership import FdbOwnership
from dbwrap_py.database import Database
from dbwrap_py.nodecache import sync
from dbwrap_py.nodecache.agent import NodeAgentProcess
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.protocol import Ownership

# the same backends (the run's shared servers, under this module's prefix) and two node agents as there
from test_node_cache import TTL, backend, fdb_backend, name, nodes, open_on, put  # noqa: F401  (fixtures)


pytestmark = pytest.mark.server

#: what Ownership.owners costs, where it is not one round trip: rados reads
#: the objects' entries together, then asks the OSD about the holder's lease;
#: cassandra reads the bucket partitions 100 at a time (256 buckets), then ``nodes``;
#: zookeeper lists the locks and the live leases together, then reads the locks
OWNERS_ROUND_TRIPS = {"rados": 2, "cassandra": 4, "zookeeper": 2}


def delete(db, key: bytes) -> None:
    db.lock(key)
    db.delete(key)
    db.unlock(key)


def stored_version(backend, direct: Database, key: bytes) -> int:
    """What moves whenever the store's copy of ``key`` is written: the
    database's sequence number where every write moves it (etcd,
    sqlite_leased, fdb), else the record's own: its object's version (rados),
    its value's write time (cassandra)."""
    adapter = getattr(direct.adapter, "inner", direct.adapter)
    if backend.adapter == "rados":
        adapter.io.stat(adapter.oid_of(key))
        return adapter.io.get_last_version()
    if backend.adapter == "cassandra":
        from dbwrap_py.adapters.cassandra import client as cc

        cql = f"SELECT WRITETIME(v) AS written FROM {adapter.config.keyspace}.node_volatile " \
              "WHERE db = ? AND bucket = ? AND k = ?"
        rows = adapter.client.run("test", cql, (adapter.db, bucket_of(key), cc.stored_key(key)))
        return rows[0].written if rows else 0
    return direct.seqnum()


def test_a_traverse_sees_records_another_node_has_not_written_back(backend, nodes, name):
    a, b = nodes
    on_a = open_on(backend, a, name)
    on_b = open_on(backend, b, name)
    put(on_a, b"kept", b"v1")
    assert dict(on_b.traverse(write=False)) == {b"kept": b"v1"}, \
        "node a's new record, only in its cache, is listed on node b"
    put(on_a, b"kept", b"v2")   # a's again: b's traverse only read it
    put(on_a, b"open", b"share-mode")
    delete(on_a, b"kept")       # the store had it: the traverse must not list it any more
    assert dict(on_b.traverse(write=False)) == {b"open": b"share-mode"}
    assert dict(on_b.traverse(write=True)) == {b"open": b"share-mode"}, "a write traverse too"
    on_b.close()
    on_a.close()


def test_a_traverse_waits_for_a_dead_owner_no_longer_than_its_timeout(backend, nodes, name, capfd):
    a, b = nodes
    keeper = open_on(backend, None, name)  # an opener throughout: no CLEAR_IF_FIRST wipe
    on_a = open_on(backend, a, name)
    put(on_a, b"written", b"back")
    on_b = open_on(backend, b, name, node_cache_sync_timeout="0.5")
    assert dict(on_b.traverse(write=False)) == {b"written": b"back"}
    put(on_a, b"written", b"later")  # only in node a's cache
    a.stop(signal.SIGKILL)           # its lease lives on for up to TTL seconds
    started = time.monotonic()
    listed = dict(on_b.traverse(write=False))
    took = time.monotonic() - started
    err = capfd.readouterr().err
    assert listed == {b"written": b"back"}, "the dead node's record as last written back"
    assert "node(s) a did not write their records through within 0.5 s" in err, err
    assert took < TTL, f"the traverse took {took:.2f} s: it waited past its timeout (0.5 s)"
    on_b.close()
    on_a.close()
    keeper.close()


def test_an_owner_writes_through_what_no_process_holds_while_one_holds_a_record(backend, nodes, name):
    """A process of node a holds one record through node b's traverse:
    node a's agent still writes its other records through (its scan passes
    the held hash chain instead of waiting on it), then gives up on the held
    one; node b lists the others as node a has them."""
    a, b = nodes
    on_a = open_on(backend, a, name)
    put(on_a, b"busy", b"v")
    put(on_a, b"free", b"only on a")  # another hash chain; only in node a's cache
    on_b = open_on(backend, b, name, node_cache_sync_timeout="2")
    on_a.lock(b"busy")
    try:
        listed = dict(on_b.traverse(write=False))
    finally:
        on_a.unlock(b"busy", b"v")
    assert listed.get(b"free") == b"only on a", listed
    on_b.close()
    on_a.close()


def test_a_traverse_nobody_else_owns_records_of_costs_one_round_trip(backend, nodes, name):
    _, b = nodes
    direct = open_on(backend, None, name)
    on_b = open_on(backend, b, name)
    put(on_b, b"mine", b"v")
    assert dict(direct.traverse(write=False)) == {}  # once first: a lazily opened store's setup is no scan's (fdb)
    before = backend.round_trips(direct)
    assert dict(direct.traverse(write=False)) == {}
    scan_cost = backend.round_trips(direct) - before
    before = backend.round_trips(on_b)
    assert dict(on_b.traverse(write=False)) == {b"mine": b"v"}
    owners_cost = OWNERS_ROUND_TRIPS.get(backend.adapter, 1)
    assert backend.round_trips(on_b) - before == scan_cost + owners_cost, \
        f"the store's scan and one question, who owns ({owners_cost} round trip(s))"
    on_b.close()
    direct.close()


def test_an_owner_writes_through_again_only_what_changed(backend, nodes, name):
    """An owner whose records did not change since its last full answer
    writes nothing: the store's copy of the record is not written again."""
    a, b = nodes
    direct = open_on(backend, None, name)
    on_a = open_on(backend, a, name)
    on_b = open_on(backend, b, name)
    put(on_a, b"open", b"v1")
    for _ in range(2):  # the first answer marks the record as in the store, the second finds it so
        assert dict(on_b.traverse(write=False)) == {b"open": b"v1"}
    settled = stored_version(backend, direct, b"open")
    assert dict(on_b.traverse(write=False)) == {b"open": b"v1"}
    assert stored_version(backend, direct, b"open") == settled, "nothing changed on node a: nothing written through"
    put(on_a, b"open", b"v2")
    assert dict(on_b.traverse(write=False)) == {b"open": b"v2"}
    assert stored_version(backend, direct, b"open") != settled, "a changed record is written through"
    on_b.close()
    on_a.close()
    direct.close()


def test_an_adapter_that_lists_no_owners_traverses_the_store_and_says_so_once(tmp_path, monkeypatch, capfd):
    """An adapter without Ownership.owners (here fdb (model) with the
    protocol's default put back, in this process: the traversing one): a
    traverse sees other nodes' records as last written back, and says so."""
    monkeypatch.setattr(sync, "_unsupported_said", set())
    monkeypatch.setattr(FdbOwnership, "owners", Ownership.owners)
    name = str(tmp_path / "locking.tdb")
    with fdb_backend() as fdb, \
            NodeAgentProcess(fdb.adapter, fdb.options(), tmp_path / "node-a", node="a", ttl=TTL) as a, \
            NodeAgentProcess(fdb.adapter, fdb.options(), tmp_path / "node-b", node="b", ttl=TTL) as b:
        on_a = open_on(fdb, a, name)
        on_b = open_on(fdb, b, name)
        put(on_a, b"open", b"on-node-a")
        for _ in range(2):
            assert dict(on_b.traverse(write=False)) == {}, "only node a has it"
        said = [line for line in capfd.readouterr().err.splitlines() if "does not list" in line]
        assert len(said) == 1 and "as last written back" in said[0], said
        on_b.close()
        on_a.close()


def test_a_polled_request_outlives_its_expiry_while_the_asking_node_lives():
    """fdb (model): release requests expire (REQUEST_SECONDS), and an agent
    drops an expired one unserved; a traverse's request, which its polls
    keep (request_waiting), stays while the asking node's lease lives, so
    that gone means served. One asked beside it and not polled expires."""
    import threading

    from dbwrap_py.adapters.fdb.nodekeys import REQUEST_SECONDS
    from dbwrap_py.adapters.fdb.adapter import FdbAdapter
    from dbwrap_py.options import Options

    db_id, polled, left = b"locking.tdb@keepalive", sync.sync_key(b"b"), b"not polled"
    with fdb_backend() as fdb:
        store = FdbAdapter.node_store(Options(fdb.options()))
        try:
            lease = store.grant(b"b", TTL)
            ownership = store.database(db_id)
            for key in (polled, left):
                ownership.request_release(key, b"a", lease.id)
            ends = time.monotonic() + REQUEST_SECONDS + 1
            while time.monotonic() < ends:
                assert store.keepalive(lease, 1.0) > 0, "node b's lease lives on"
                assert ownership.request_waiting(polled, b"a", lease.id), "nobody served it"
                time.sleep(0.25)
            stop = threading.Event()
            threading.Timer(1.0, stop.set).start()  # past the requests standing: no more will come
            listed = list(store.requests(b"a", stop))  # as node a's agent reads them: expired ones go
        finally:
            store.close()
    assert (db_id, polled) in listed, f"the polled request expired unserved: {listed}"
    assert (db_id, left) not in listed, f"a request nobody polls expires, or this test shows nothing: {listed}"
