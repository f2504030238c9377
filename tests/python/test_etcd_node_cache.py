"""The etcd adapter's node cache (node_cache = yes) against a real etcd.

Two "nodes" on one host: two node agents, each with its own cache directory
and node name, on one throwaway etcd. Processes are forked; a process is on
node A or node B by the node_cache_dir it opens the database with.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dbwrap_py.database import Database
from dbwrap_py.errors import FencedOut
from dbwrap_py.servers.etcd import EtcdCluster
from dbwrap_py.servers.etcd_agent import NodeAgentProcess

from test_etcd import Child, open_etcd, put, raw_call, b64

TTL = 2


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(nodes=1) as cluster:
        yield cluster


@pytest.fixture
def nodes(etcd, tmp_path) -> Iterator[tuple[NodeAgentProcess, NodeAgentProcess]]:
    options = {"endpoints": etcd.endpoints, "lease_ttl": str(TTL)}
    with NodeAgentProcess(options, tmp_path / "node-a", node="a") as a, \
            NodeAgentProcess(options, tmp_path / "node-b", node="b") as b:
        yield a, b


@pytest.fixture
def name(tmp_path) -> str:
    return str(tmp_path / "locking.tdb")


def open_on(etcd: EtcdCluster, node: NodeAgentProcess | Path, name: str, **options: str) -> Database:
    cache_dir = node.cache_dir if isinstance(node, NodeAgentProcess) else node
    opts = {"node_cache": "yes", "node_cache_dir": str(cache_dir), "lease_ttl": str(TTL), **options}
    return open_etcd(etcd.endpoints, name, volatile=True, **opts)


def increment(db: Database, key: bytes) -> None:
    value = db.lock(key)
    db.unlock(key, str(int(value or b"0") + 1).encode())


def lock_key_holders(etcd: EtcdCluster) -> list[bytes]:
    """The values of every record lock key in etcd (node ownerships included)."""
    reply = raw_call(etcd.endpoints, "/v3/kv/range", {"key": b64(b"\0"), "range_end": b64(b"\0")})
    return [base64.b64decode(kv.get("value", "")) for kv in reply.get("kvs", [])
            if b"/l/" in base64.b64decode(kv["key"])]


def test_a_node_owning_a_record_needs_no_round_trip(etcd, nodes, name):
    a, _ = nodes
    db = open_on(etcd, a, name)
    increment(db, b"k")  # migrates the record in: one round trip
    before = db.adapter.round_trips
    for _ in range(100):
        increment(db, b"k")
    assert db.fetch(b"k") == b"101"
    assert db.adapter.round_trips == before, "an owned record costs no etcd round trip"
    assert db.adapter.capabilities.lock_release_seconds == 0.0
    db.close()


def test_increments_from_two_nodes_are_never_lost(etcd, nodes, name):
    """Records migrate back and forth between the nodes; no write is lost."""
    a, b = nodes
    db = open_on(etcd, a, name)
    put(db, b"n", b"0")

    def work(node: NodeAgentProcess) -> int:
        def run(ch: Child) -> int:
            mine = open_on(etcd, node, name, op_timeout="20")
            for _ in range(40):
                increment(mine, b"n")
            return 40
        return run

    children = [Child(work(node)) for node in (a, b, a, b)]
    assert sum(child.result() for child in children) == 160
    db_b = open_on(etcd, b, name)
    assert db_b.fetch(b"n") == b"160"
    assert db.fetch(b"n") == b"160"
    db_b.close()
    db.close()


def test_a_direct_process_and_a_cached_node_exclude_each_other(etcd, nodes, name):
    """Without the cache, a process still waits for a node's ownership and sees its writes."""
    a, _ = nodes
    cached = open_on(etcd, a, name)
    direct = open_etcd(etcd.endpoints, name, volatile=True, lease_ttl=str(TTL))
    increment(cached, b"k")
    increment(direct, b"k")  # asks node a to hand the record back
    increment(cached, b"k")  # migrates it in again
    assert direct.fetch(b"k") == b"3"
    assert cached.fetch(b"k") == b"3"
    direct.close()
    cached.close()


def test_a_stopped_agent_writes_everything_back(etcd, nodes, name, tmp_path):
    a, _ = nodes
    db = open_on(etcd, a, name)
    for key in (b"x", b"y", b"z"):
        put(db, key, key * 3)
    db.lock(b"z")
    db.delete(b"z")
    db.unlock(b"z")
    a.stop()  # SIGTERM: drain
    direct = open_etcd(etcd.endpoints, name, volatile=True, op_timeout="0.5")
    assert dict(direct.traverse(write=False)) == {b"x": b"xxx", b"y": b"yyy"}
    direct.lock(b"x")  # the node's lock keys went with the drain, not after a lease
    direct.unlock(b"x")
    assert not [h for h in lock_key_holders(etcd) if h.startswith(b"node:a")]
    # the process goes on without the cache
    increment(db, b"n")
    assert direct.fetch(b"n") == b"1"
    direct.close()
    db.close()


def test_a_crashed_agent_fences_its_writers_and_frees_its_records(etcd, nodes, name):
    a, b = nodes
    db = open_on(etcd, a, name)
    put(db, b"k", b"before")
    db.lock(b"k")
    a.stop(signal.SIGKILL)
    crashed = time.monotonic()
    on_b = open_on(etcd, b, name, op_timeout=str(TTL + 5))
    assert on_b.lock(b"k") is None, "node a never wrote it back: etcd has no record"
    freed = time.monotonic() - crashed
    on_b.unlock(b"k", b"after")
    print(f"a SIGKILLed node agent's records were free after {freed:.2f} s (lease TTL {TTL} s)")
    assert freed <= TTL + 1.0
    with pytest.raises(FencedOut):
        db.store(b"k", b"stale", 1)  # the write node a's lease no longer covers
    db.unlock(b"k")
    assert on_b.fetch(b"k") == b"after"
    assert db.fetch(b"k") == b"after", "without its agent, node a reads through etcd"
    on_b.close()
    db.close()


def test_without_an_agent_the_adapter_works_without_the_cache(etcd, tmp_path, name):
    db = open_on(etcd, tmp_path / "no-agent", name)
    before = db.adapter.round_trips
    increment(db, b"k")
    increment(db, b"k")
    assert db.fetch(b"k") == b"2"
    assert db.adapter.round_trips - before >= 5, "every operation went to etcd"
    db.close()


def test_a_first_opener_wipe_voids_the_node_copies(etcd, nodes, name):
    a, _ = nodes
    db = open_on(etcd, a, name)
    put(db, b"k", b"v")
    db.close()  # nobody has it open now
    again = open_on(etcd, a, name)  # CLEAR_IF_FIRST: wiped
    assert again.fetch(b"k") is None
    assert list(again.traverse(write=False)) == []
    again.close()


def test_deleted_records_are_vacuumed_back_to_etcd(etcd, nodes, name):
    a, _ = nodes
    db = open_on(etcd, a, name)
    for i in range(20):
        key = b"open-%d" % i
        put(db, key, b"x")
        db.lock(key)
        db.delete(key)
        db.unlock(key)
    assert len([h for h in lock_key_holders(etcd) if h.startswith(b"node:a")]) == 20
    deadline = time.monotonic() + 10
    while [h for h in lock_key_holders(etcd) if h.startswith(b"node:a")]:
        assert time.monotonic() < deadline, "the agent never handed the deleted records back"
        time.sleep(0.2)
    assert list(db.traverse(write=False)) == []
    db.close()


def test_agent_refuses_a_second_agent_on_one_cache_dir(etcd, nodes):
    a, _ = nodes
    with pytest.raises(Exception, match="did not come up"):
        with NodeAgentProcess({"endpoints": etcd.endpoints}, a.cache_dir, node="c"):
            pass
    assert os.path.exists(a.cache_dir / "node.state"), "the running agent's state is untouched"
