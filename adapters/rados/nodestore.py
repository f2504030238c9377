"""The rados node agent's store: its lease and requests on its node object.

Node leases: cls_lock ``lease`` on ``<prefix>/_nodes/<node>``, cookie the
lease id, held for the TTL and renewed with LOCK_MUST_RENEW: the OSD judges
expiry, and an expired lease stays dead.

Release requests: omap entries ``q<db>/<key>`` on the owner's node object
(valued by a nonce: a request made again is a new one; then the asking
node, if a node asks: ``nodenames.request_value``), then a notify on it;
the agent watches the object and reads the entries.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections.abc import Iterator

import rados

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados.nodenames import LEASE_LOCK, node_oid, parse_request
from dbwrap_py.adapters.rados.ownership import RadosOwnership
from dbwrap_py.errors import Timeout, Unavailable
from dbwrap_py.nodecache.ownership_base import PerDatabase, grant_retrying, new_requests
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served

#: how often an agent reads its requests even without a notify (a lost watch)
REQUESTS_POLL = 1.0


class RadosNodeStore(NodeStore):
    """The node agent's side: its lease and requests on its node object."""

    def __init__(self, config: rc.ClientConfig, prefix: str, op_timeout: float) -> None:
        self.ops = rc.Ops(config)
        self.prefix = prefix
        self.op_timeout = op_timeout
        self._databases = PerDatabase(self._open)
        self._watch: object | None = None
        self._node = b""  # the node granted a lease, for its keepalives

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        oid = node_oid(self.prefix, node)
        lease = secrets.randbits(63) or 1
        grant_retrying(node, lambda: self.ops.write(oid, lambda op: op.execute(
            "lock", "lock", rc.lock_op(LEASE_LOCK, f"{lease:x}", ttl)), "grant a node lease") == 0,
            ttl, self.op_timeout)
        self._node = node
        return NodeLease(lease, ttl)

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        oid = node_oid(self.prefix, self._node)
        with rados.WriteOpCtx() as op:
            op.execute("lock", "lock", rc.lock_op(LEASE_LOCK, f"{lease.id:x}", lease.ttl, rc.LOCK_MUST_RENEW))
            with rc.translated("keepalive"):
                completion = self.ops.io.operate_aio_write_op(op, oid)
            if not _wait(completion, timeout):
                _ABANDONED.append(completion)  # freed in flight, it would crash its callback
                raise Timeout(f"keepalive: no answer within {timeout:g} s")
        result = completion.get_return_value()
        if result == 0:
            return lease.ttl
        if -result in rc.REFUSED:
            return 0.0  # expired: the OSD dropped it, and it stays dropped
        raise rc.failed(result, "keepalive")

    def revoke(self, lease: NodeLease) -> None:
        self.ops.write(node_oid(self.prefix, self._node), lambda op: (
            op.execute("lock", "assert_locked", rc.assert_op(LEASE_LOCK, f"{lease.id:x}")),
            op.rm_xattr(rc.lock_xattr(LEASE_LOCK))), "revoke")

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
        oid = node_oid(self.prefix, node)
        woken: queue.Queue[None] = queue.Queue()
        self.ops.write(oid, lambda op: op.new(rados.LIBRADOS_CREATE_IDEMPOTENT), "requests")
        with rc.translated("watch for release requests"):
            watch = self.ops.io.watch(oid, lambda *_: woken.put(None), timeout=30)
        self._watch = watch

        def read() -> dict[tuple[str, bytes], tuple[bytes, bytes] | None]:
            # by (entry, nonce): a request made again is new
            return {entry: parse_request(entry[0]) for entry in self.ops.page(oid, "", "q", "release requests")[0]}

        def wait() -> None:
            try:
                woken.get(timeout=REQUESTS_POLL)
                while not woken.empty():
                    woken.get_nowait()
            except queue.Empty:
                pass

        try:
            yield from new_requests(read, wait, stop)
        finally:
            self._watch = None
            try:
                watch.close()
            except rados.Error:
                pass

    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        self.database(db_id).served(node, key)

    def database(self, db_id: bytes) -> RadosOwnership:
        return self._databases(db_id)

    def _open(self, db_id: bytes) -> RadosOwnership:
        meta_oid = f"{self.prefix}/{db_id.decode()}"
        with rc.translated("find the database"):
            try:
                objects = int(self.ops.io.get_xattr(meta_oid, "n") or b"1")
            except rados.ObjectNotFound:
                raise Unavailable(f"database {db_id.decode()!r}: no {meta_oid} in the pool") from None
        return RadosOwnership(self.ops, self.prefix, meta_oid, db_id, objects, 0, self.op_timeout)


#: keepalives given up on while in flight
_ABANDONED: list[object] = []


def _wait(completion: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not completion.is_complete():  # type: ignore[attr-defined]
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True
