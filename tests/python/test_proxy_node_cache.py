"""smbd's fast path over the proxy (protocol version 2): NODE_CACHE, MOVE_IN
and HAND_OVER, against a real daemon process and real node agents on
sqlite_leased (no server). The daemon opens the database on node a; this
process opens it too, as another process of node a would, to hold chainlocks
and read the node's local records; node b is a second agent and cache
directory on the same store.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dbwrap_py import ntstatus as nt
from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.nodecache import cache as cache_module
from dbwrap_py.nodecache.agent import NodeAgentProcess
from dbwrap_py.nodecache.cache import local_files
from dbwrap_py.proxy.client import ConnectionClosed, ProxyClient, ProxyError
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.daemon import ProxyDaemonProcess
from dbwrap_py.retry import Backoff
from dbwrap_py.servers import pause_process

from test_etcd import Child
from test_node_cache import TTL, name, nodes, open_on, put, sqlite_leased_backend  # noqa: F401 (fixtures)

pytestmark = pytest.mark.server


TIMEOUT = 10.0
PROMPT = 0.5  # a MOVE_IN that must not wait answers well within this


@pytest.fixture(scope="module")
def backend():
    with sqlite_leased_backend() as backend:
        yield backend


@pytest.fixture(scope="module")
def daemon() -> Iterator[ProxyDaemonProcess]:
    with ProxyDaemonProcess() as running:
        yield running
        assert "internal error" not in running.log_text()


def connect(daemon: ProxyDaemonProcess) -> ProxyClient:
    client = ProxyClient(daemon.socket_path, TIMEOUT)
    assert client.hello()[0] == wire.VERSION
    return client


def open_via(client: ProxyClient, backend, node: NodeAgentProcess | Path, name: str, **options: str) -> int:
    """The database on ``node``'s cache, opened in the daemon as smbd opens it."""
    cache_dir = node.cache_dir if isinstance(node, NodeAgentProcess) else node
    opts = {"node_cache": "yes", "node_cache_dir": str(cache_dir), **backend.options(), **options}
    return client.open(name, backend.adapter, [f"{k}={v}" for k, v in opts.items()],
                       tdb_flags=TDB_CLEAR_IF_FIRST)


def owned_here(db, key: bytes):
    """The node's local copy of ``key`` if the node owns it: (lease, token, flags, value)."""
    cache = db.adapter.cache
    return cache.records.owned(key, cache.state.lease())


def move_in_eventually(client: ProxyClient, db: int, key: bytes, within: float = TIMEOUT) -> float:
    """Ask as smbd does (again after a pause) until the node owns ``key``; the seconds it took."""
    start = time.monotonic()
    while not client.move_in(db, key):
        assert time.monotonic() - start < within, f"{key!r} never moved in"
        time.sleep(0.01)
    return time.monotonic() - start


def wait_until(condition, what: str, within: float = TIMEOUT) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


# -- NODE_CACHE ------------------------------------------------------------------


def test_node_cache_names_the_files_of_a_write_back_cache(backend, nodes, name, daemon):
    a, _ = nodes
    with connect(daemon) as client:
        db = open_via(client, backend, a, name)
        files = client.node_cache(db)
        here = open_on(backend, a, name)
        try:
            cache = here.adapter.cache
            assert files.cache_id == cache.db_id
            assert files.wipe_revision == cache.wipe_revision
            assert files.op_timeout_ms == 5000  # the backend's op_timeout = 5
            assert Path(files.cache_dir) == Path(a.cache_dir).absolute()
            assert (Path(files.cache_dir) / "node.state").exists(), "the agent's state file is there"
            records, buckets = Path(files.records_path), Path(files.buckets_path)
            assert records.is_absolute() and buckets.is_absolute()
            assert records.exists() and buckets.exists()
            assert (records, buckets) == local_files(a.cache_dir.absolute(), cache.db_id)
        finally:
            here.close()


@pytest.mark.parametrize("kind", ["tdb", "write-through", "no agent"])
def test_fast_path_ops_on_any_other_database_are_not_supported(backend, nodes, name, daemon, tmp_path, kind):
    a, _ = nodes
    with connect(daemon) as client:
        if kind == "tdb":
            db, cause = client.open(str(tmp_path / "plain.tdb"), "tdb"), "not a write-back node cache"
        elif kind == "write-through":
            db = open_via(client, backend, a, name, node_cache="write-through")
            cause = "not a write-back node cache"
        else:
            db, cause = open_via(client, backend, tmp_path / "no-agent", name), "no node agent"
        for call in (lambda: client.node_cache(db), lambda: client.move_in(db, b"k"),
                     lambda: client.hand_over(db, b"k")):
            with pytest.raises(ProxyError) as caught:
                call()
            assert caught.value.status == nt.NT_STATUS_NOT_SUPPORTED
            assert cause in caught.value.cause
        client.close_db(db)  # a reply, not a hang-up: the connection goes on
    # smbd asks every database it opens (proxy_fastpath is on by default):
    # only a cache without its agent is worth a log line
    logged = [line for line in daemon.log_text().splitlines() if cause in line]
    assert bool(logged) == (kind == "no agent"), logged


def test_a_version_1_connection_sending_a_fast_path_op_is_hung_up_on(daemon, tmp_path):
    with ProxyClient(daemon.socket_path, TIMEOUT, version=1) as client:
        assert client.hello()[0] == 1
        db = client.open(str(tmp_path / "plain.tdb"), "tdb")
        with pytest.raises(ConnectionClosed):
            client.node_cache(db)
    wait_until(lambda: "NODE_CACHE on a version 1 connection" in daemon.log_text(), "not logged")


def test_a_version_2_connection_sending_write_through_is_hung_up_on(daemon, tmp_path):
    with ProxyClient(daemon.socket_path, TIMEOUT, version=2) as client:
        assert client.hello()[0] == 2
        db = client.open(str(tmp_path / "plain.tdb"), "tdb")
        client.lock(db, b"k")
        with pytest.raises(ConnectionClosed):
            client.write_through(db, b"k")
    wait_until(lambda: "WRITE_THROUGH on a version 2 connection" in daemon.log_text(), "not logged")


# -- WRITE_THROUGH -----------------------------------------------------------------------


def test_write_through_puts_a_held_record_in_the_store_and_the_node_keeps_it(backend, nodes, name, daemon):
    """What smbd's per-record persistence asks of the daemon for a persistent
    record: in the store before the reply, and still the node's."""
    a, b = nodes
    here = open_on(backend, a, name)
    with connect(daemon) as client:
        db = open_via(client, backend, a, name)
        client.lock(db, b"persistent")
        client.store(db, b"persistent", b"handle")
        client.write_through(db, b"persistent")
        client.unlock(db, b"persistent")
        assert owned_here(here, b"persistent") is not None, "the node let go of the record"
        client.lock(db, b"volatile")
        client.unlock(db, b"volatile", b"v1")
        with pytest.raises(ProxyError) as refused:
            client.write_through(db, b"persistent")  # not held by this connection
        assert refused.value.status == nt.NT_STATUS_FILE_LOCK_CONFLICT
    a.stop(signal.SIGKILL)
    on_b = open_on(backend, b, name, op_timeout=str(TTL + 5))
    try:
        assert on_b.fetch(b"persistent") == b"handle"
        assert on_b.fetch(b"volatile") is None, "a write-back record outlived its node"
    finally:
        on_b.close()
        here.close()


# -- MOVE_IN ---------------------------------------------------------------------------


def test_move_in_of_a_fresh_key_makes_the_node_its_owner(backend, nodes, name, daemon):
    a, _ = nodes
    here = open_on(backend, a, name)
    try:
        with connect(daemon) as client:
            db = open_via(client, backend, a, name)
            assert owned_here(here, b"fresh") is None
            assert client.move_in(db, b"fresh") is True
            owned = owned_here(here, b"fresh")
            assert owned is not None, "MOVE_IN answered 1 but the node does not own the record"
            assert owned[3] is None  # a new record: no value yet
            assert client.move_in(db, b"fresh") is True  # owned already: still 1
    finally:
        here.close()


def test_move_in_under_a_held_chainlock_says_not_yet_at_once(backend, nodes, name, daemon):
    """smbd holds the key's chainlock: the daemon must not wait for it, and
    serves everyone else meanwhile."""
    a, _ = nodes
    here = open_on(backend, a, name)
    local = here.adapter.cache.local
    try:
        with connect(daemon) as client, connect(daemon) as other:
            db, db_other = open_via(client, backend, a, name), open_via(other, backend, a, name)
            local.lock(b"held")
            try:
                started = time.monotonic()
                assert client.move_in(db, b"held") is False
                assert time.monotonic() - started < PROMPT
                assert owned_here(here, b"held") is None
                started = time.monotonic()
                assert other.move_in(db_other, b"elsewhere") is True  # the daemon answers others
                assert client.move_in(db, b"held") is False
                assert time.monotonic() - started < PROMPT
            finally:
                local.unlock(b"held")
            assert client.move_in(db, b"held") is True
            assert owned_here(here, b"held") is not None
    finally:
        here.close()


def test_move_in_of_a_record_another_node_holds_goes_to_the_store_once_per_pause(backend, nodes, name,
                                                                                monkeypatch):
    """Every waiting process of a node asks MOVE_IN on its own: after a take
    that met a holder, the next waits TAKE_WAIT's pause, so the store sees
    one waiter per node and key; once the record is free it moves in."""
    a, b = nodes
    monkeypatch.setattr(cache_module, "TAKE_WAIT", Backoff(0.4, 0.4))  # held back 0.2-0.4 s
    here = open_on(backend, a, name)
    on_b = open_on(backend, b, name)
    try:
        cache = here.adapter.cache
        takes = []
        take = cache.ownership.take
        monkeypatch.setattr(cache.ownership, "take", lambda *args: takes.append(args) or take(*args))
        put(on_b, b"hot", b"from b")
        on_b.lock(b"hot")
        try:
            started = time.monotonic()
            asked = [cache.move_in(b"hot") for _ in range(50)]
            assert time.monotonic() - started < 0.2, "the 50 asks took too long for this test to say anything"
            assert asked == [False] * 50
            assert len(takes) == 1, f"{len(takes)} takes went to the store for 50 asks within one pause"
            time.sleep(0.45)
            assert cache.move_in(b"hot") is False
            assert len(takes) == 2, "after the pause the next ask goes to the store again"
        finally:
            on_b.unlock(b"hot", b"written on b")
        deadline = time.monotonic() + TIMEOUT
        while not cache.move_in(b"hot"):
            assert time.monotonic() < deadline, "the record never moved in"
            time.sleep(0.01)
        assert owned_here(here, b"hot")[3] == b"written on b"
    finally:
        on_b.close()
        here.close()


def test_move_in_of_a_record_another_node_holds_asks_it_and_moves_in_later(backend, nodes, name, daemon):
    a, b = nodes
    here = open_on(backend, a, name)
    on_b = open_on(backend, b, name)
    try:
        with connect(daemon) as client:
            db = open_via(client, backend, a, name)
            put(on_b, b"theirs", b"from b")
            on_b.lock(b"theirs")  # a process of node b holds it: b's agent cannot hand it over
            released = False
            try:
                started = time.monotonic()
                assert client.move_in(db, b"theirs") is False
                assert time.monotonic() - started < PROMPT
                b_cache = on_b.adapter.cache
                wait_until(lambda: b_cache.state.wanted(b_cache.db_id, b"theirs"),
                           "node b was never asked to let the record go")
                assert client.move_in(db, b"theirs") is False  # asked again, still held
                on_b.unlock(b"theirs", b"written on b")  # b's process hands it over as it lets go
                released = True
            finally:
                if not released:
                    on_b.unlock(b"theirs")
            move_in_eventually(client, db, b"theirs")
            owned = owned_here(here, b"theirs")
            assert owned is not None and owned[3] == b"written on b"
            assert owned_here(on_b, b"theirs") is None
    finally:
        on_b.close()
        here.close()


# -- HAND_OVER -----------------------------------------------------------------------


def _lock_on(backend, node: NodeAgentProcess, name: str, key: bytes):
    def run(ch: Child) -> bytes | None:
        db = open_on(backend, node, name, op_timeout="20")
        value = db.lock(key)
        db.unlock(key)
        return value
    return run


def test_hand_over_gives_a_wanted_record_to_the_node_waiting_for_it(backend, nodes, name, daemon):
    """smbd unlocked a record node b waits for, and sends HAND_OVER. Node a's
    agent is stopped meanwhile, so only the daemon can have handed it over."""
    a, b = nodes
    here = open_on(backend, a, name)
    cache = here.adapter.cache
    try:
        with connect(daemon) as client:
            db = open_via(client, backend, a, name)
            put(here, b"hot", b"on a")
            cache.local.lock(b"hot")  # as smbd's fast path holds it: the chainlock only
            waiter = Child(_lock_on(backend, b, name, b"hot"))
            stopped = False
            try:
                wait_until(lambda: cache.state.wanted(cache.db_id, b"hot"), "node b never asked for it")
                pause_process(a.pid)  # well within the lease (TTL 2 s): the agent stays a's
                stopped = True
                cache.local.unlock(b"hot")  # the chainlock alone: no handover on the way
                assert owned_here(here, b"hot") is not None
                client.hand_over(db, b"hot")
                assert owned_here(here, b"hot") is None, "HAND_OVER did not hand the record over"
                ready, _, _ = select.select([waiter._from_child], [], [], 0.5)
                assert ready, "node b did not get the record after HAND_OVER"
            finally:
                if stopped:
                    os.kill(a.pid, signal.SIGCONT)
                else:
                    cache.local.unlock(b"hot")
            assert waiter.result() == b"on a"
    finally:
        here.close()


def test_hand_over_leaves_a_record_a_process_holds_again(backend, nodes, name, daemon):
    """HAND_OVER while a process holds the chainlock again: it replies OK at
    once and leaves the record to that holder."""
    a, _ = nodes
    here = open_on(backend, a, name)
    cache = here.adapter.cache
    try:
        with connect(daemon) as client:
            db = open_via(client, backend, a, name)
            put(here, b"busy", b"v")
            cache.local.lock(b"busy")
            try:
                started = time.monotonic()
                client.hand_over(db, b"busy")
                assert time.monotonic() - started < PROMPT
                assert owned_here(here, b"busy") is not None
            finally:
                cache.local.unlock(b"busy")
    finally:
        here.close()


# -- the request counts ----------------------------------------------------------------------


def test_the_daemon_logs_its_requests_by_op_as_it_stops(backend, nodes, name):
    """Owned records done in the process never reach the daemon: only the
    ops sent here are counted."""
    a, _ = nodes
    with ProxyDaemonProcess() as daemon:
        with connect(daemon) as client:
            db = open_via(client, backend, a, name)
            client.node_cache(db)
            assert client.move_in(db, b"k") is True
            assert client.move_in(db, b"k") is True
            client.hand_over(db, b"k")
        here = open_on(backend, a, name)  # a process of node a uses the owned record: no request
        put(here, b"k", b"local")
        here.close()
        daemon.stop()
        assert daemon.request_counts() == {"HELLO": 1, "OPEN": 1, "NODE_CACHE": 1, "MOVE_IN": 2,
                                           "HAND_OVER": 1}


# -- traverse --------------------------------------------------------------------


@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
def test_a_traverse_through_the_daemon_sees_another_nodes_records(backend, nodes, name, daemon, write):
    """The daemon's traverse is CachedAdapter.scan too: node a's record, only
    in node a's cache, is listed by a traverse on node b (nodecache/sync.py)."""
    a, b = nodes
    on_a = open_on(backend, a, name)
    try:
        with connect(daemon) as client:
            db = open_via(client, backend, b, name)
            put(on_a, b"open", b"on-node-a")
            assert owned_here(on_a, b"open") is not None, "node a owns it, unwritten"
            assert dict(client.traverse(db, write)) == {b"open": b"on-node-a"}
            client.close_db(db)
    finally:
        on_a.close()
