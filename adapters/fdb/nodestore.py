"""The fdb node agent's store: its node lease and its release requests, on its own network."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from dbwrap_py.adapters.fdb import store as fs
from dbwrap_py.adapters.fdb.nodekeys import LEASE, REQUEST, lease_expiry, serve
from dbwrap_py.adapters.fdb.ownership import FdbOwnership
from dbwrap_py.nodecache.ownership_base import PerDatabase, grant_retrying, new_requests
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served

if TYPE_CHECKING:
    from dbwrap_py.adapters.fdb.store import FdbStore

#: how long the agent waits on its doorbell before it looks at the stop flag
DOORBELL_SLICE = 0.5


class FdbNodeStore(NodeStore):
    """The node agent's side: its lease and its release requests, on its own network."""

    def __init__(self, open_store: Callable[[bytes], FdbStore], op_timeout: float) -> None:
        self.op_timeout = op_timeout
        self._store = PerDatabase(open_store)
        self._nodes: dict[int, bytes] = {}  # lease -> the node it was granted to
        self.shared = self._store(b"\0")  # the node keys only: no database has this name

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        keys, lease = self.shared.nodes, secrets.randbits(63) or 1

        def body(tr: Any, _: bool) -> bool:
            version = tr.get_read_version().wait()
            raw = fs.value_of(tr.get(keys.lease(node)))
            if raw is not None and LEASE.unpack(raw)[1] > version:
                return False
            tr.set(keys.lease(node), LEASE.pack(lease, version + int(ttl * fs.VERSIONS_PER_SECOND)))
            return True

        grant_retrying(node, lambda: self.shared.run("node lease", body), ttl, self.op_timeout)
        self._nodes[lease] = node
        return NodeLease(lease, ttl)

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        keys, node = self.shared.nodes, self._nodes[lease.id]

        def body(tr: Any, _: bool) -> float:
            version = tr.get_read_version().wait()
            if lease_expiry(tr, keys, node, lease.id) <= version:
                return 0.0  # ran out, or a takeover buried it: it cannot be revived
            tr.set(keys.lease(node), LEASE.pack(lease.id, version + int(lease.ttl * fs.VERSIONS_PER_SECOND)))
            return lease.ttl

        return self.shared.run("node keepalive", body)

    def revoke(self, lease: NodeLease) -> None:
        keys, node = self.shared.nodes, self._nodes[lease.id]

        def body(tr: Any, _: bool) -> None:
            if lease_expiry(tr, keys, node, lease.id):
                tr.clear(keys.lease(node))

        self.shared.run("node revoke", body)

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
        """The requests standing, then each new one when the doorbell rings
        (a watch on it, set in the transaction that read them), and each one
        served (``nodekeys.serve`` rings it too)."""
        keys = self.shared.nodes
        begin = keys.requests(node)
        doorbell: list[Any] = []  # the watch set by the last read

        def body(tr: Any, _: bool) -> dict[tuple[bytes, int], tuple[bytes, bytes]]:
            # by (request key, nonce): a request asked again is new, one kept alive (request_waiting) is not
            version, found = tr.get_read_version().wait(), {}
            for kv in tr.get_range(begin, fs.prefix_end(begin)):
                expiry, nonce = REQUEST.unpack_from(bytes(kv.value))
                if expiry <= version:
                    tr.clear(bytes(kv.key))  # its requester stopped asking
                else:
                    db, rest = fs.decode(bytes(kv.key)[len(begin):])
                    found[(bytes(kv.key), nonce)] = (db, fs.decode(rest)[0])
            doorbell[:] = [tr.watch(keys.doorbell(node))]
            return found

        def wait() -> None:
            rung = threading.Event()
            doorbell[0].on_ready(lambda _future: rung.set())
            while not rung.wait(DOORBELL_SLICE) and not stop.is_set():
                pass
            if not doorbell[0].is_ready():
                doorbell[0].cancel()

        return new_requests(lambda: self.shared.run("release requests", body), wait, stop)

    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        keys = self._store(db_id).nodes
        self.shared.run("release request served", lambda tr, _: serve(tr, keys, node, key))

    def database(self, db_id: bytes) -> FdbOwnership:
        store = self._store(db_id)
        return FdbOwnership(lambda method, *args: store.ownership(method, *args), self.op_timeout)

    def close(self) -> None:
        for store in self._store.take_all():
            store.close()
