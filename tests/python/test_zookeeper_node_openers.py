"""zookeeper with the node cache: smbd's children are openers through their
parent's registration (dbwrap_py.openers, ``covers_children``), as tdb
covers them and as etcd's are (test_etcd_node_openers.py): a child makes
no opener znode and does not join the openers (no versioned rewrite of
``base/o``, no ``ensure`` of the generation's folders); its first use of
the store is its own session and the record's own round trips. Without
it, 64 smbd children opening at once (bench cluster --workload own-files
--nprocs 64) each rewrote ``base/o`` on the version it read, lost the race
to the others again and again (up to 25 tries, two round trips each, per
database) and some finished no open in the run's 5 s. Against a throwaway
ZooKeeper and a real node agent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from dbwrap_py.database import Database
from dbwrap_py.nodecache.agent import NodeAgentProcess
from dbwrap_py.nodecache.layout import bucket_of

from test_etcd import Child
from test_node_cache import TTL, ZooKeeperBackend, increment, name, open_on, put, zookeeper_backend  # noqa: F401

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def backend() -> Iterator[ZooKeeperBackend]:
    with zookeeper_backend() as backend:
        yield backend


@pytest.fixture
def agent(backend: ZooKeeperBackend, tmp_path) -> Iterator[NodeAgentProcess]:
    with NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-a", node="a", ttl=TTL) as a:
        yield a


def inner(db: Database):
    return getattr(db.adapter, "inner", db.adapter)


def openers(backend: ZooKeeperBackend, db: Database) -> list[int]:
    """The session (ephemeral owner) of every opener znode of the database."""
    client = KazooClient(hosts=backend.reach["hosts"])
    client.start(timeout=10)
    try:
        folder = f"{inner(db).base}/o"
        return sorted(client.exists(f"{folder}/{n}").ephemeralOwner for n in client.get_children(folder))
    finally:
        client.stop()
        client.close()


def other_bucket_key(*taken: bytes) -> bytes:
    """A key of a bucket none of ``taken`` is in: the child's take of it goes to the store."""
    buckets = {bucket_of(key) for key in taken}
    return next(key for key in (b"n%d" % i for i in range(1000)) if bucket_of(key) not in buckets)


def child_of(db: Database, key: bytes) -> tuple[int, int, int]:
    """In a forked child: an increment of ``key`` (its bucket claimed by the
    child, through its own session) and a read of an owned record; then the
    child's session id, the pid of the registration it keeps, and the
    round trips its session made, its open included."""
    def in_child(_ch: Child) -> tuple[int, int, int]:
        increment(db, key)
        assert db.fetch(b"k") == b"parent"
        session = inner(db).zk
        registration = inner(db)._registration
        return session.client.client_id[0], registration.pid if registration else 0, session.round_trips

    return Child(in_child).result()


def test_a_forked_child_is_an_opener_through_its_parents_registration(backend, agent, name):
    db = open_on(backend, agent, name)
    put(db, b"k", b"parent")
    parent_session = inner(db).zk.client.client_id[0]
    assert openers(backend, db) == [parent_session]
    key = other_bucket_key(b"k")
    for _ in range(2):
        session, registered_by, round_trips = child_of(db, key)
        assert session != parent_session, "the child used its parent's session"
        assert registered_by == os.getpid(), "the child registered as an opener of its own"
        # the claim of the key's bucket (its multi, l/ and d/ listed behind it; no records to read): no join
        assert round_trips <= 2, f"the child's open, increment and read took {round_trips} round trips"
    assert openers(backend, db) == [parent_session], "a child registered, or took its parent's opener away"
    assert db.fetch(key) == b"2"
    db.close()


def test_a_parents_registration_keeps_the_database_from_another_nodes_wipe(backend, agent, tmp_path, name):
    on_a = open_on(backend, agent, name)
    put(on_a, b"k", b"parent")
    child_of(on_a, other_bucket_key(b"k"))
    with NodeAgentProcess(backend.adapter, backend.options(), tmp_path / "node-b", node="b", ttl=TTL) as b:
        on_b = open_on(backend, b, name)
        assert on_b.fetch(b"k") == b"parent", "node b's open wiped the database node a's processes use"
        on_b.close()
    on_a.close()
