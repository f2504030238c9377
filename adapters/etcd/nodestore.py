"""The etcd node agent's store: its lease (etcd's), its registration, and
the release requests under ``_nodes/<node>/r/``, watched."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from dbwrap_py.adapters.etcd.client import _b64, _Config, _Transport, _unb64
from dbwrap_py.adapters.etcd.keys import (
    DatabaseKeys,
    parse_request,
    prefix_end,
    prefix_option,
    registration,
    request,
    requests_prefix,
)
from dbwrap_py.adapters.etcd.ownership import EtcdOwnership, compare_create, put_op
from dbwrap_py.nodecache.ownership_base import grant_retrying
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served
from dbwrap_py.options import Options


class EtcdNodeStore(NodeStore):
    """The node agent's connection to etcd."""

    def __init__(self, config: _Config, prefix: bytes) -> None:
        self.config = config
        self.prefix = prefix
        self._transport = _Transport(config)
        self._keepalives = _Transport(config)  # its own thread
        self._watch: Any = None

    def _call(self, path: str, body: Mapping[str, Any], idempotent: bool = True,
              transport: _Transport | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.config.op_timeout
        return (transport or self._transport).call(path, body, deadline, idempotent)

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        reply = self._call("/v3/lease/grant", {"TTL": str(int(ttl))})
        lease = NodeLease(int(reply["ID"]), float(reply.get("TTL", ttl)))
        key = registration(self.prefix, node)
        grant_retrying(node, lambda: bool(self._call("/v3/kv/txn", {
            "compare": [compare_create(key, 0)], "success": [put_op(key, b"agent", lease.id)]}).get("succeeded")),
            ttl, self.config.op_timeout, "is registered by a live agent")
        return lease

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        reply = self._keepalives.call("/v3/lease/keepalive", {"ID": str(lease.id)},
                                      time.monotonic() + timeout, True)
        return float(reply.get("result", {}).get("TTL", 0))

    def revoke(self, lease: NodeLease) -> None:
        self._call("/v3/lease/revoke", {"ID": str(lease.id)})

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
        head = requests_prefix(self.prefix, node)
        transport = _Transport(self.config)
        try:
            reply = self._call("/v3/kv/range", {"key": _b64(head), "range_end": _b64(prefix_end(head)),
                                                "keys_only": True}, transport=transport)
            for kv in reply.get("kvs", []):
                parsed = parse_request(self.prefix, node, _unb64(kv["key"]))
                if parsed is not None:
                    yield parsed
            body = {"create_request": {"key": _b64(head), "range_end": _b64(prefix_end(head)),
                                       "start_revision": str(int(reply["header"]["revision"]) + 1)}}
            conn = transport.open_stream("/v3/watch", body, time.monotonic() + self.config.op_timeout)
            self._watch = conn
            conn.settimeout(None)  # close() ends it
            pending = b""
            while not stop.is_set():
                chunk = conn.read_chunk()
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    result = json.loads(line).get("result", {}) if line.strip() else {}
                    for event in result.get("events", []):
                        parsed = parse_request(self.prefix, node, _unb64(event["kv"]["key"]))
                        if parsed is not None:  # a deletion: served, or its requester's lease ended
                            yield Served(*parsed) if event.get("type") == "DELETE" else parsed
                    if result.get("canceled"):
                        raise ConnectionError("watch canceled")
        finally:
            transport.close()

    def done(self, node: bytes, db: bytes, key: bytes) -> None:
        self._call("/v3/kv/deleterange", {"key": _b64(request(self.prefix, node, db, key))})

    def database(self, db: bytes) -> EtcdOwnership:
        return EtcdOwnership(lambda path, body, idempotent: self._call(path, body, idempotent),
                             DatabaseKeys(self.prefix, db), self.config.op_timeout)

    def close(self) -> None:
        conn = self._watch
        if conn is not None:
            try:  # wakes the thread reading it; a plain close would wait for that read
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._transport.close()
        self._keepalives.close()


def agent_store(options: Options) -> EtcdNodeStore:
    """The node agent's connection (``dbwrap-py node-agent --adapter etcd``):
    the adapter's ``node_store``."""
    return EtcdNodeStore(_Config.from_options(options), prefix_option(options))
