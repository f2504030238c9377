"""The etcd adapter's side of the node cache (dbwrap_py.nodecache.protocol).

A node owns a record while it holds the record's lock key, valued
``node:<name>:<lease>`` on its node lease, or while it holds the record's
bucket (``b/<bb>`` on the node lease) and the key is not detached
(``x/<bb>/<key>``). Tokens are create_revisions; every write-back compares
the key that holds the ownership with its token, in the same transaction.
Leases are etcd's: the server ends them, no clock on a node decides.
Release requests are keys under the owner's ``_nodes/<node>/r/``, watched by
its agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dbwrap_py.adapters.etcd.client import _b64, _unb64
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, marker_node, node_marker, prefix_end, request
from dbwrap_py.errors import DbwrapError
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.protocol import Claim, OwnedElsewhere, Ownership, Taken

#: (path, body, idempotent) -> the gateway's reply; the caller sets the deadline
Call = Callable[[str, Mapping[str, Any], bool], dict[str, Any]]


def compare_create(key: bytes, revision: int, range_end: bytes | None = None) -> dict[str, Any]:
    compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}
    if range_end is not None:
        compare["range_end"] = _b64(range_end)
    return compare


def compare_value(key: bytes, value: bytes) -> dict[str, Any]:
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def range_op(key: bytes, range_end: bytes | None = None, keys_only: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key)}
    if range_end is not None:
        body["range_end"] = _b64(range_end)
    if keys_only:
        body["keys_only"] = True
    return {"request_range": body}


def put_op(key: bytes, value: bytes = b"", lease: int = 0) -> dict[str, Any]:
    body = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: bytes, range_end: bytes | None = None) -> dict[str, Any]:
    body = {"key": _b64(key)}
    if range_end is not None:
        body["range_end"] = _b64(range_end)
    return {"request_delete_range": body}


def first_kv(response: Mapping[str, Any]) -> Mapping[str, Any] | None:
    kvs = response.get("response_range", {}).get("kvs")
    return kvs[0] if kvs else None


def first_value(response: Mapping[str, Any]) -> bytes | None:
    kv = first_kv(response)
    return _unb64(kv.get("value")) if kv is not None else None


class EtcdOwnership(Ownership):
    """One database's ownership operations, over ``call``."""

    def __init__(self, call: Call, keys: DatabaseKeys, op_timeout: float) -> None:
        self._call = call
        self.keys = keys
        self.op_timeout = op_timeout

    def _txn(self, body: Mapping[str, Any], idempotent: bool = True) -> dict[str, Any]:
        return self._call("/v3/kv/txn", body, idempotent)

    def _value_ops(self, key: bytes, value: bytes | None) -> list[dict[str, Any]]:
        data = self.keys.data(key)
        return [delete_op(data) if value is None else put_op(data, value), put_op(self.keys.seq)]

    def read(self, key: bytes) -> tuple[bytes | None, bool]:
        """A process's read of ``key``: its value, and whether a node owns it
        (its lock key names a node, or its bucket is claimed and the key not
        detached); one transaction."""
        k = self.keys
        owned = [range_op(k.lock(key)), range_op(k.bucket(bucket_of(key))), range_op(k.detached(key))]
        reply = self._txn({"compare": [compare_create(k.lock(key), 0), compare_create(k.bucket(bucket_of(key)), 0)],
                           "success": [range_op(k.data(key))], "failure": [*owned, range_op(k.data(key))]})
        responses = reply.get("responses", [])
        value = first_value(responses[-1])
        if reply.get("succeeded"):
            return value, False
        holder, claim, detached = (first_kv(responses[i]) for i in range(3))
        if holder is not None:
            return value, marker_node(_unb64(holder.get("value"))) is not None
        return value, claim is not None and detached is None

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        k = self.keys
        marker = node_marker(node, lease)
        bucket = k.bucket(bucket_of(key))
        lock = k.lock(key)
        reply = self._txn({
            "compare": [compare_create(lock, 0), compare_create(bucket, 0)],
            "success": [put_op(lock, marker, lease), range_op(k.data(key))],
            "failure": [range_op(lock), range_op(bucket), range_op(k.detached(key)), range_op(k.data(key))],
        })
        responses = reply.get("responses", [])
        if reply.get("succeeded"):
            return Taken(first_value(responses[1]), int(responses[0]["response_put"]["header"]["revision"]))
        holder, claim, detached = (first_kv(responses[i]) for i in range(3))
        value = first_value(responses[3])
        if holder is not None:
            if _unb64(holder.get("value")) == marker:  # a taker of ours died before keeping it
                return Taken(value, int(holder["create_revision"]))
            raise OwnedElsewhere(marker_node(_unb64(holder.get("value"))), f"{key!r} is locked")
        assert claim is not None
        if detached is None:
            if _unb64(claim.get("value")) == marker:
                return Taken(value, int(claim["create_revision"]), via_bucket=True)
            raise OwnedElsewhere(marker_node(_unb64(claim.get("value"))), f"{key!r}'s bucket is claimed")
        # detached from its bucket: owned record by record
        reply = self._txn({
            "compare": [compare_create(lock, 0), compare_create(k.detached(key), int(detached["create_revision"]))],
            "success": [put_op(lock, marker, lease), range_op(k.data(key))],
        })
        if not reply.get("succeeded"):
            raise OwnedElsewhere(None, f"{key!r} changed hands; again")
        responses = reply["responses"]
        return Taken(first_value(responses[1]), int(responses[0]["response_put"]["header"]["revision"]))

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        k = self.keys
        locks, detached, data = k.bucket_locks(bucket), k.bucket_detached(bucket), k.bucket_data(bucket)
        reply = self._txn({
            "compare": [compare_create(k.bucket(bucket), 0),
                        compare_create(locks, 0, prefix_end(locks)),
                        compare_create(detached, 0, prefix_end(detached))],
            "success": [put_op(k.bucket(bucket), node_marker(node, lease), lease),
                        range_op(data, prefix_end(data))],
        })
        if not reply.get("succeeded"):
            return None
        responses = reply["responses"]
        records = {k.record_key(_unb64(kv["key"]), k.data_prefix): _unb64(kv.get("value"))
                   for kv in responses[1].get("response_range", {}).get("kvs", [])}
        return Claim(int(responses[0]["response_put"]["header"]["revision"]), records)

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        body = {"key": _b64(request(self.keys.prefix, owner, self.keys.db, key)), "lease": str(requester_lease)}
        if requester:  # whom hand_over gives the record to
            body["value"] = _b64(node_marker(requester, requester_lease))
        self._call("/v3/kv/put", body, True)

    def _fence(self, key: bytes, token: int, via_bucket: bool) -> dict[str, Any]:
        held_by = self.keys.bucket(bucket_of(key)) if via_bucket else self.keys.lock(key)
        return compare_create(held_by, token)

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        k = self.keys
        done = delete_op(request(k.prefix, node, k.db, key))
        end = put_op(k.detached(key), b"", lease) if via_bucket else delete_op(k.lock(key))
        reply = self._txn({"compare": [self._fence(key, token, via_bucket)],
                           "success": [*self._value_ops(key, value), end, done],
                           "failure": [done]})
        return bool(reply.get("succeeded"))

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """Two transactions: the write-back, which reads the release request
        and leaves it standing; then the requester's lock key put on its
        lease, if the record is still free and the request as read (it is
        on the requester's lease: standing means that lease lives). One
        transaction cannot do it: etcd puts no key it deletes in the same
        one, and the token is the lock key's create_revision, which must
        be new. The holder's chainlock keeps its own node's waiters out
        between the two."""
        k = self.keys
        asked = request(k.prefix, node, k.db, key)
        end = put_op(k.detached(key), b"", lease) if via_bucket else delete_op(k.lock(key))
        reply = self._txn({"compare": [self._fence(key, token, via_bucket)],
                           "success": [*self._value_ops(key, value), end, range_op(asked)],
                           "failure": [delete_op(asked)]})
        if not reply.get("succeeded"):
            return False
        found = first_kv(reply["responses"][-1])
        if found is not None:
            try:
                self._give(key, asked, found)
            except DbwrapError:  # the record is handed back all the same: the node must forget it
                pass  # the request stays; the asker takes the record free, the agent removes it (let_go)
        return True

    def _give(self, key: bytes, asked: bytes, found: Mapping[str, Any]) -> None:
        """After the write-back: the record to the node that asked (its lock
        key on its lease), the request removed as read."""
        k = self.keys
        marker = _unb64(found.get("value"))
        compare = {"key": _b64(asked), "target": "MOD", "result": "EQUAL", "mod_revision": found["mod_revision"]}
        if marker_node(marker) is None:  # a process asked: the record stays free
            self._txn({"compare": [compare], "success": [delete_op(asked)]})
            return
        reply = self._txn({"compare": [compare, compare_create(k.lock(key), 0)],
                           "success": [put_op(k.lock(key), marker, int(found["lease"])), delete_op(asked)]})
        if not reply.get("succeeded"):  # taken meanwhile (by the asking node's own look, most likely)
            self._txn({"compare": [compare], "success": [delete_op(asked)]})

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        reply = self._txn({"compare": [self._fence(key, token, via_bucket)],
                           "success": self._value_ops(key, value)})
        return bool(reply.get("succeeded"))

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        k = self.keys
        done = delete_op(request(k.prefix, node, k.db, key))
        self._txn({"compare": [compare_value(k.lock(key), node_marker(node, lease))],
                   "success": [delete_op(k.lock(key)), done], "failure": [done]})

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        k = self.keys
        fence = compare_create(k.bucket(bucket), token)
        ops = [op for key, value in records.items() for op in self._value_ops(key, value)[:1]]
        ops += [put_op(k.seq)] if ops else []
        chunk = 100  # under etcd's default --max-txn-ops of 128
        for start in range(0, len(ops), chunk):
            if not self._txn({"compare": [fence], "success": ops[start:start + chunk]}).get("succeeded"):
                return False
        detached = k.bucket_detached(bucket)
        reply = self._txn({"compare": [fence], "success": [delete_op(detached, prefix_end(detached)),
                                                           delete_op(k.bucket(bucket))]})
        return bool(reply.get("succeeded"))

    def owner(self, key: bytes) -> bytes | None:
        k = self.keys
        reply = self._txn({"success": [range_op(k.lock(key)), range_op(k.bucket(bucket_of(key))),
                                       range_op(k.detached(key))]})
        responses = reply.get("responses", [])
        holder, claim, detached = (first_value(responses[i]) for i in range(3))
        if holder is not None:
            return marker_node(holder)
        if claim is not None and detached is None:
            return marker_node(claim)
        return None

    def owners(self) -> frozenset[bytes]:
        # record locks and bucket claims: both go with their lease
        k = self.keys
        reply = self._txn({"success": [range_op(k.locks_prefix, prefix_end(k.locks_prefix)),
                                       range_op(k.buckets_prefix, prefix_end(k.buckets_prefix))]})
        markers = (_unb64(kv.get("value")) for response in reply.get("responses", [])
                   for kv in response.get("response_range", {}).get("kvs", []))
        return frozenset(node for node in map(marker_node, markers) if node is not None)

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        reply = self._call("/v3/kv/range", {"key": _b64(request(self.keys.prefix, owner, self.keys.db, key)),
                                            "count_only": True}, True)
        return int(reply.get("count", 0)) > 0
