"""A write-back node cache's traverse sees every node's records (nodecache/sync.py).

Two "nodes" on one host, as in test_node_cache: two node agents on one
store, a process on node A or B by the node_cache_dir it opens with. On the
adapters that say who owns a database's records (etcd, sqlite_leased).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from dbwrap_py.nodecache import sync
from dbwrap_py.nodecache.agent import NodeAgentProcess

from test_node_cache import TTL, etcd_backend, fdb_backend, open_on, put, sqlite_leased_backend

BACKENDS = {"etcd": etcd_backend, "sqlite_leased": sqlite_leased_backend}


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend(request):
    with BACKENDS[request.param]() as backend:
        yield backend


@pytest.fixture
def nodes(backend, tmp_path) -> Iterator[tuple[NodeAgentProcess, NodeAgentProcess]]:
    with NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-a", node="a", ttl=TTL) as a, \
            NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-b", node="b", ttl=TTL) as b:
        yield a, b


@pytest.fixture
def name(tmp_path) -> str:
    return str(tmp_path / "locking.tdb")


def delete(db, key: bytes) -> None:
    db.lock(key)
    db.delete(key)
    db.unlock(key)


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


def test_a_traverse_nobody_else_owns_records_of_costs_one_round_trip(backend, nodes, name):
    _, b = nodes
    direct = open_on(backend, None, name)
    on_b = open_on(backend, b, name)
    put(on_b, b"mine", b"v")
    before = backend.round_trips(direct)
    assert dict(direct.traverse(write=False)) == {}
    scan_cost = backend.round_trips(direct) - before
    before = backend.round_trips(on_b)
    assert dict(on_b.traverse(write=False)) == {b"mine": b"v"}
    assert backend.round_trips(on_b) - before == scan_cost + 1, "the store's scan and one question: who owns"
    on_b.close()
    direct.close()


def test_an_owner_writes_through_again_only_what_changed(backend, nodes, name):
    """Each write-through reaches the store's sequence number: an owner
    whose records did not change since its last full answer writes nothing."""
    a, b = nodes
    direct = open_on(backend, None, name)
    on_a = open_on(backend, a, name)
    on_b = open_on(backend, b, name)
    put(on_a, b"open", b"v1")
    for _ in range(2):  # the first answer marks the record as in the store, the second finds it so
        assert dict(on_b.traverse(write=False)) == {b"open": b"v1"}
    settled = direct.seqnum()
    assert dict(on_b.traverse(write=False)) == {b"open": b"v1"}
    assert direct.seqnum() == settled, "nothing changed on node a: nothing written through"
    put(on_a, b"open", b"v2")
    assert dict(on_b.traverse(write=False)) == {b"open": b"v2"}
    assert direct.seqnum() != settled, "a changed record is written through"
    on_b.close()
    on_a.close()
    direct.close()


def test_an_adapter_that_lists_no_owners_traverses_the_store_and_says_so_once(tmp_path, monkeypatch, capfd):
    """fdb (as rados and cassandra) does not implement Ownership.owners: a
    traverse sees other nodes' records as last written back, and says so."""
    monkeypatch.setattr(sync, "_unsupported_said", set())
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
