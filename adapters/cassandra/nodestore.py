"""The cassandra node agent's store: its lease in ``nodes``, its requests polled from ``requests``.

Node leases: table ``nodes`` (name PRIMARY KEY, lease), the lease cell
written ``USING TTL`` by ``IF NOT EXISTS`` and renewed ``IF lease = <ours>``:
Cassandra judges expiry, and an expired lease stays dead (the condition
fails on the expired cell). An entry of a dead lease stays until someone
who needs the record reads ``nodes``, finds that lease gone, and removes
the entry with an LWT guarded on its token.

Release requests: table ``requests`` (PRIMARY KEY (node, db, k)), written
``USING TTL`` op_timeout with a nonce (a request made again is a new one)
and, a node's, its ``requester`` (``ownership.py``: ``hand_over``);
Cassandra has no watch, so the agent polls its node's partition every
``request_poll`` seconds (bench/cassandra_request_poll.py measures the cost).
A traverse's request (``nodecache/sync.py``) is answered by a conditional
delete and kept, while the asking node's lease lives, by an LWT on the nonce
its poll read: a served request is never revived.
"""

from __future__ import annotations

import math
import secrets
import threading
from collections.abc import Iterator

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.adapters.cassandra.nodecql import NodeCql
from dbwrap_py.adapters.cassandra.ownership import REQUEST_POLL, CassandraOwnership
from dbwrap_py.errors import Timeout
from dbwrap_py.nodecache.ownership_base import PerDatabase, grant_retrying, new_requests
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served

#: Cassandra's TTLs are whole seconds and expire on a whole second: a lease
#: may end up to this much before the time it was granted for
TTL_GRANULARITY = 1


class CassandraNodeStore(NodeStore):
    """The node agent's side: its lease in ``nodes``, its requests polled from ``requests``."""

    def __init__(self, config: cc.ClientConfig, poll: float = REQUEST_POLL) -> None:
        self.client = cc.Client(config)
        self.config = config
        self.poll = poll
        self.op_timeout = config.op_timeout
        self.cql = NodeCql(config.keyspace)
        self._node = b""  # the node granted a lease, for its keepalives
        self._databases = PerDatabase(lambda db_id: CassandraOwnership(
            self.client, db_id.decode(), None, self.op_timeout))
        #: the request polls sent (bench/cassandra_request_poll.py)
        self.polls = 0

    @staticmethod
    def _seconds(ttl: float) -> tuple[int, float]:
        """The TTL to send (whole seconds, at least 2) and what it grants for
        sure: a second less, as it may expire on the second before."""
        whole = max(2, math.ceil(ttl))
        return whole, float(whole - TTL_GRANULARITY)

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        ks, (seconds, granted) = self.config.keyspace, self._seconds(ttl)
        lease = secrets.randbits(63) or 1

        def attempt() -> bool:
            try:
                return self.client.lwt("grant a node lease", f"INSERT INTO {ks}.nodes (name, lease) "
                                       "VALUES (?, ?) IF NOT EXISTS USING TTL ?", (node.decode(), lease, seconds))[0]
            except cc.OutcomeUnknown:
                rows = self.client.run("grant a node lease", self.cql.lease, (node.decode(),), serial=True)
                return bool(rows) and rows[0].lease == lease

        grant_retrying(node, attempt, seconds, self.op_timeout)
        self._node = node
        return NodeLease(lease, granted)

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        seconds, granted = self._seconds(lease.ttl + TTL_GRANULARITY)
        try:
            applied, _ = self.client.lwt("keepalive", f"UPDATE {self.config.keyspace}.nodes USING TTL ? "
                                         "SET lease = ? WHERE name = ? IF lease = ?",
                                         (seconds, lease.id, self._node.decode(), lease.id), timeout=timeout)
        except cc.OutcomeUnknown as exc:
            raise Timeout(f"keepalive: {exc}") from exc  # the agent tries again soon
        return granted if applied else 0.0  # not applied: expired, and it stays so

    def revoke(self, lease: NodeLease) -> None:
        self.client.applied("revoke", f"DELETE FROM {self.config.keyspace}.nodes WHERE name = ? IF lease = ?",
                            (self._node.decode(), lease.id), unknown=lambda: True)  # unknown: it expires by itself

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
        cql = f"SELECT db, k, asked FROM {self.config.keyspace}.requests WHERE node = ?"

        def read() -> dict[tuple[str, bytes, int], tuple[bytes, bytes]]:
            self.polls += 1
            rows = self.client.run("release requests", cql, (node.decode(),))
            return {(r.db, r.k, r.asked): (r.db.encode(), r.k[1:]) for r in rows}

        return new_requests(read, lambda: stop.wait(self.poll), stop)

    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        self.client.lwt("traverse request answered", self.cql.answered,
                        (node.decode(), db_id.decode(), cc.stored_key(key)))

    def database(self, db_id: bytes) -> CassandraOwnership:
        return self._databases(db_id)
