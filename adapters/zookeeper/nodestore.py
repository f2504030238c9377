"""The zookeeper node agent's store: its session is its lease (``ownership.py``
says what it holds on it), its requests are watched children."""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Iterator

from dbwrap_py.adapters.zookeeper.client import Op, Session, ZkConfig, until
from dbwrap_py.adapters.zookeeper.ownership import ZkOwnership, lease_path
from dbwrap_py.errors import LockConflict, Timeout, Unavailable
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served
from dbwrap_py.options import Options


class ZkNodeStore(NodeStore):
    """The node agent's session: its lease, its requests, and the databases' ownership."""

    def __init__(self, options: Options) -> None:
        prefix = options.get_str("prefix", "/dbwrap_py").strip("/")
        self.top, self.node = f"/{prefix}" if prefix else "", ""
        self.nodes = f"{self.top}/_nodes"
        self.config = ZkConfig(options.get_str("hosts", ""), 0.0, options.get_float("op_timeout", 10.0, minimum=0.1))
        self._zk: Session | None = None
        #: request path -> its data and version, as read when it came: hand_over reads it no more
        self._marks: dict[str, tuple[bytes, int]] = {}

    @property
    def zk(self) -> Session:
        if self._zk is None:
            raise Unavailable("zookeeper: the node agent has no session before its grant")
        return self._zk

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        self.node = node.decode()
        if self._zk is None:  # the session is the lease: its timeout, the TTL
            self._zk = Session(dataclasses.replace(self.config, session_timeout=ttl))
        self.zk.ensure(f"{self.nodes}/a", f"{self.nodes}/l", f"{self.nodes}/r/{self.node}")
        lease = secrets.randbits(62) or 1
        register: list[Op] = [("create", f"{self.nodes}/a/{self.node}", b"%x" % lease, True),
                              ("create", lease_path(self.nodes, lease), node, True)]
        try:  # a dead predecessor's session may linger for its timeout
            until(lambda: self.zk.multi(register) is None, ttl + self.config.op_timeout, False, "the node name")
        except Timeout:
            raise LockConflict(f"node name {self.node!r} is registered by a live agent") from None
        return NodeLease(lease, ttl)

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        """A round trip renews the session; the lease lives while its fence does, in our session."""
        stat = self.zk.stat(lease_path(self.nodes, lease.id), timeout)
        return lease.ttl if stat is not None and stat.ephemeralOwner == self.zk.client.client_id[0] else 0.0

    def revoke(self, lease: NodeLease) -> None:
        self.zk.multi([("delete", lease_path(self.nodes, lease.id)), ("delete", f"{self.nodes}/a/{self.node}")])

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
        """The new requests' data read with them, in a round trip for all
        that came together (a burst of hand-overs then costs one each)."""
        folder = f"{self.nodes}/r/{node.decode()}"

        def read(found: dict[str, tuple[bytes, int]]) -> None:
            if len(self._marks) >= 4096:  # left by a listing that ended (they are read again as they come)
                self._marks.clear()
            self._marks.update((f"{folder}/{name}", mark) for name, mark in found.items())

        for name, standing in self.zk.child_changes(folder, stop, read=read):
            db, _, key = name.partition(".")
            request = bytes.fromhex(db), bytes.fromhex(key)
            if not standing:
                self._marks.pop(f"{folder}/{name}", None)
            yield request if standing else Served(*request)

    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        self.zk.multi([("delete", f"{self.nodes}/r/{node.decode()}/{db_id.hex()}.{key.hex()}")])

    def database(self, db_id: bytes) -> ZkOwnership:
        return ZkOwnership(lambda: self.zk, f"{self.top}/{db_id.decode()}", None, self.config.op_timeout,
                           self._marks)

    def close(self) -> None:
        if self._zk is not None:
            self._zk.stop()
