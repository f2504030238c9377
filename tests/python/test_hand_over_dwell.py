"""How a node hands a record over to another node that asked for it
(dbwrap_py.nodecache.agent: HAND_OVER_DWELL, the agent's --dwell,
IDLE_SECONDS and HOT_SECONDS): a record nobody on the node holds goes at
once, unless it is hot (the node handed it over within HOT_SECONDS); one a
process holds, or a hot one, stays for the dwell while its node's own
processes use it, then goes (marked wanted if held); one its node leaves
alone for IDLE_SECONDS goes before its dwell is over. Two node agents on
sqlite_leased (no server), with a dwell of a second, so that what the test
sees is the rule, not the machine's speed; node b's side runs in a forked
process, as another smbd would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dbwrap_py.nodecache.agent import NodeAgentProcess
from dbwrap_py.nodecache.state import NodeState

from test_etcd import Child
from test_node_cache import SqliteLeasedBackend, open_on, put  # noqa: F401

pytestmark = pytest.mark.server

DWELL = 1.0
#: the agents' --idle: a record its node changes every millisecond is in use
#: even when this machine is loaded (at the 5 ms default, a test process
#: descheduled for a few milliseconds left it "idle" under make test)
IDLE = 0.1


@pytest.fixture
def nodes(tmp_path) -> Iterator[tuple[SqliteLeasedBackend, NodeAgentProcess, NodeAgentProcess]]:
    backend = SqliteLeasedBackend(tmp_path / "sqlite_leased.cluster")
    with NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-a", node="a", ttl=10,
                          dwell=DWELL, idle=IDLE) as a, \
            NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-b", node="b", ttl=10,
                             dwell=DWELL, idle=IDLE) as b:
        yield backend, a, b


def lock_on_b(backend, b: NodeAgentProcess, name: str) -> Child:
    """Node b's process: it locks ``k``, says how long that took and what it read, and lets go."""
    def run(ch: Child) -> tuple[float, bytes | None]:
        db = open_on(backend, b, name)
        ch.send("opened")
        started = time.monotonic()
        value = db.lock(b"k")
        took = time.monotonic() - started
        db.unlock(b"k")
        db.close()
        return took, value

    child = Child(run)
    assert child.recv() == "opened"
    return child


def wanted(a: NodeAgentProcess, db, key: bytes) -> bool:
    state = NodeState(str(a.cache_dir))
    try:
        return state.wanted(db.adapter.cache.db_id, key)
    finally:
        state.close()


def test_a_record_nobody_holds_goes_at_once(nodes, tmp_path):
    backend, a, b = nodes
    name = str(tmp_path / "locking.tdb")
    on_a = open_on(backend, a, name)
    put(on_a, b"k", b"from a")  # node a owns it; nobody holds it
    took, value = lock_on_b(backend, b, name).result()
    assert value == b"from a"
    assert took < DWELL / 2, f"a free record waited {took:.2f} s, as if it dwelt"
    on_a.close()


def test_a_held_record_dwells_while_its_node_uses_it_then_goes(nodes, tmp_path):
    backend, a, b = nodes
    name = str(tmp_path / "locking.tdb")
    on_a = open_on(backend, a, name)
    put(on_a, b"k", b"0")
    on_a.lock(b"k")  # held on node a when node b asks
    asked = time.monotonic()
    child = lock_on_b(backend, b, name)
    used = 0
    while time.monotonic() < asked + DWELL / 2:  # node a goes on using it meanwhile
        used += 1
        on_a.unlock(b"k", str(used).encode())
        on_a.lock(b"k")
        time.sleep(0.01)
    assert not wanted(a, on_a, b"k"), "marked wanted before its dwell was over"
    deadline = time.monotonic() + 3 * DWELL
    while not wanted(a, on_a, b"k"):  # held from here on: marked once the dwell is over
        assert time.monotonic() < deadline, "never marked wanted after the dwell"
        time.sleep(0.02)
    on_a.unlock(b"k", b"last")  # wanted: handed over now
    took, value = child.result()
    assert value == b"last"
    assert took >= DWELL * 0.9, f"node b had it after {took:.2f} s, within the dwell"
    assert used > 1, "node a could not use the record while it dwelt"
    on_a.close()


def hot_on_a(backend, a: NodeAgentProcess, b: NodeAgentProcess, name: str):
    """Node a's handle on ``k``, which a handed over to b and took back
    just now: hot on node a."""
    on_a = open_on(backend, a, name)
    put(on_a, b"k", b"0")
    assert lock_on_b(backend, b, name).result()[1] == b"0"  # a hands it over: cold, at once
    put(on_a, b"k", b"1")  # and takes it back from b
    return on_a


def test_a_hot_record_dwells_while_its_node_keeps_using_it(nodes, tmp_path):
    """smbd's share-mode records are g_locks: between two holds the record
    is free, yet the node is using it. A hot record stays for the dwell."""
    backend, a, b = nodes
    name = str(tmp_path / "locking.tdb")
    on_a = hot_on_a(backend, a, b, name)
    child = lock_on_b(backend, b, name)
    used, until = 1, time.monotonic() + 1.5 * DWELL
    while time.monotonic() < until:  # free between holds, changed every millisecond
        used += 1
        put(on_a, b"k", str(used).encode())
        time.sleep(0.001)
    took, value = child.result()
    assert took >= DWELL * 0.9, f"a hot record in use went after {took:.2f} s, within its dwell"
    assert value is not None and int(value) > 2, f"node b read {value!r}: node a did not use it meanwhile"
    on_a.close()


def test_a_hot_record_its_node_leaves_alone_goes_before_its_dwell(nodes, tmp_path):
    """Node a's processes may be waiting for something node b's hold (a
    g_lock): a hot record nobody here changes goes, not after the dwell."""
    backend, a, b = nodes
    name = str(tmp_path / "locking.tdb")
    on_a = hot_on_a(backend, a, b, name)
    took, value = lock_on_b(backend, b, name).result()
    assert value == b"1"
    assert took < DWELL / 2, f"a hot record nobody used waited {took:.2f} s, its whole dwell"
    on_a.close()
