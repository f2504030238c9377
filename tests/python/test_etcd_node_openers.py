"""etcd with the node cache: smbd's children are openers through their
parent's registration (dbwrap_py.openers, ``covers_children``), as tdb
covers them, so a child makes no opener key, grants no lease and runs no
keepalive of its own. Against the run's etcd and a real node agent.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import pytest

from dbwrap_py.adapters.etcd.keys import prefix_end
from dbwrap_py.database import Database
from dbwrap_py.nodecache.agent import NodeAgentProcess

from shared_servers import PrefixedEtcd
from test_etcd import Child, raw_call
from test_node_cache import TTL, EtcdBackend, increment, name, open_on, put  # noqa: F401 (fixture)

pytestmark = pytest.mark.server


@pytest.fixture
def backend(shared_etcd: PrefixedEtcd) -> EtcdBackend:
    return EtcdBackend(shared_etcd)


@pytest.fixture
def agent(backend: EtcdBackend, tmp_path) -> Iterator[NodeAgentProcess]:
    with NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-a", node="a", ttl=TTL) as a:
        yield a


def opener_leases(backend: EtcdBackend) -> list[int]:
    """The lease of every opener key under the module's prefix, as etcd has them."""
    prefix = backend.shared.prefix.encode() + b"/"
    reply = raw_call(backend.shared.endpoints, "/v3/kv/range",
                     {"key": base64.b64encode(prefix).decode(),
                      "range_end": base64.b64encode(prefix_end(prefix)).decode()})
    return [int(kv.get("lease", 0)) for kv in reply.get("kvs", [])
            if b"/o/" in base64.b64decode(kv["key"])]


def process_lease(db: Database) -> int | None:
    """The lease this process's etcd session holds (None: never granted)."""
    inner = getattr(db.adapter, "inner", db.adapter)
    return inner._process()._lease_id


def child_of(db: Database) -> tuple[int | None, int, int]:
    """In a forked child: an increment and a read, then the child's own
    lease (None: none granted), the pid of the registration it keeps, and
    the adapter's round trips those took."""
    def in_child(ch: Child) -> tuple[int | None, int, int]:
        inner = getattr(db.adapter, "inner", db.adapter)
        before = inner.round_trips
        increment(db, b"n")
        db.fetch(b"k")
        registration = inner._registration
        return process_lease(db), registration.pid if registration else 0, inner.round_trips - before

    return Child(in_child).result()


def test_a_forked_child_is_an_opener_through_its_parents_registration(backend, agent, name):
    db = open_on(backend, agent, name)
    put(db, b"k", b"parent")
    parent_lease = process_lease(db)
    assert opener_leases(backend) == [parent_lease]
    for _ in range(2):
        lease, registered_by, round_trips = child_of(db)
        assert lease is None, "the child granted itself a lease"
        assert registered_by == os.getpid()
        assert round_trips <= 2, f"the child's first increment and read took {round_trips} round trips"
    assert opener_leases(backend) == [parent_lease], "a child registered, or took its parent's key away"
    assert db.fetch(b"n") == b"2"
    db.close()
    assert opener_leases(backend) == [], "the parent's close left its opener key"


def test_without_an_agent_a_child_registers_itself(backend, tmp_path, name):
    """The broken example's counterpart (no node agent: every process is an
    opener of its own): the checks above tell the two apart."""
    db = open_on(backend, tmp_path / "no-agent", name)
    put(db, b"k", b"parent")
    lease, registered_by, round_trips = child_of(db)
    assert lease is not None and registered_by != os.getpid()
    assert round_trips > 2
    db.close()


def test_a_parents_registration_keeps_the_database_from_another_nodes_wipe(backend, agent, tmp_path, name):
    on_a = open_on(backend, agent, name)
    put(on_a, b"k", b"kept")
    child_of(on_a)
    with NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-b", node="b", ttl=TTL) as b:
        on_b = open_on(backend, b, name)
        assert on_b.fetch(b"k") == b"kept"
        on_b.close()
    on_a.close()
