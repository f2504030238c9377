"""The fdb adapter's side of the node cache (dbwrap_py.nodecache.protocol):
the ownership operations, each one transaction; the keys they use are in
``nodekeys.py``, the node agent's store in ``nodestore.py``.

A node lease's expiry is a read version, as a record lock's: the cluster
judges it, never a node's clock. A node owns what it holds while its lease
is live at the reading transaction's read version. Tokens are the read
version of the transaction that took the ownership: a CLEAR_IF_FIRST wipe
reads the node keys it clears, so a take that commits after it read at a
version above the wipe's (``FdbStore.wipe_revision``), and tokens up to it
are void. Each write-back reads the key that holds the ownership, so a
takeover and a write-back of the same record conflict; a takeover from a
node whose lease ran out also clears that lease, so the node's keepalive,
which reads it, cannot revive it past the takeover. A hand-over is a
write-back that, in the same transaction, makes the record the asking
node's (``NodeOps.hand_over``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dbwrap_py.adapters.fdb import store as fs
from dbwrap_py.adapters.fdb.nodekeys import (
    HELD,
    REQUEST,
    ask,
    asker,
    bury,
    held_of,
    holder,
    lease_expiry,
    requester_expiry,
    serve,
)
from dbwrap_py.errors import ConfigError, FencedOut
from dbwrap_py.nodecache.adapter import node_cache_mode
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import CalledOwnership, elsewhere, taken

if TYPE_CHECKING:
    from dbwrap_py.adapters.fdb.store import FdbStore
    from dbwrap_py.options import Options

#: what a bucket's write-back commits per transaction, under FoundationDB's 10,000,000 bytes
RELEASE_BYTES = 4_000_000


def refuse_unsafe_node_cache(kind: str, options: Options, agent: bool = False) -> None:
    """The node cache's leases are judged in read versions, which a real
    cluster moves ahead at a recovery: a node could go on serving records
    that another node has taken. Until leases are judged otherwise, the node
    cache runs on the model only (where versions never jump)."""
    if kind == "real" and (agent or node_cache_mode(options) is not None):
        raise ConfigError("node_cache on FoundationDB is not safe yet: node leases are judged in read "
                          "versions, which a recovery moves ahead (docs/adapters/fdb.md); it runs on "
                          "fdb_library = model only")


class NodeOps:
    """The ownership operations on one database's store, each one transaction.
    Results are plain values, so a relay (``relay.py``) can carry them."""

    def __init__(self, store: FdbStore) -> None:
        self.store = store
        self.keys = store.nodes

    def _own_lease(self, tr: Any, node: bytes, lease: int) -> int:
        version = tr.get_read_version().wait()
        if lease_expiry(tr, self.keys, node, lease, snapshot=True) <= version:
            raise FencedOut(f"node {node.decode()}'s lease {lease:x} is not live in FoundationDB")
        return version

    def take(self, key: bytes, node: bytes, lease: int) -> tuple[Any, ...]:
        """``taken`` or ``elsewhere`` (ownership_base), plain values."""
        store = self.store

        def body(tr: Any, _: bool) -> tuple[Any, ...]:
            version = self._own_lease(tr, node, lease)
            value = store.read_record(tr, key)
            if store.lock_expiry(tr, key) > version:
                return elsewhere(None, f"{key!r} is locked by a process")
            owner = holder(tr, store, key, version)
            if owner is not None:
                if owner.node != node or owner.lease != lease:
                    return elsewhere(owner.node, f"{key!r} is node {owner.node.decode()}'s")
                return taken(value, owner.token, owner.via_bucket)  # a taker of ours died before keeping it
            tr.set(self.keys.lock(key), HELD.pack(version, lease) + node)
            return taken(value, version)

        return store.run("node take", body)

    def claim(self, bucket: int, node: bytes, lease: int) -> tuple[int, dict[bytes, bytes]] | None:
        store, keys = self.store, self.keys
        inside = bytes([bucket])

        def body(tr: Any, _: bool) -> tuple[int, dict[bytes, bytes]] | None:
            version = self._own_lease(tr, node, lease)
            held = held_of(fs.value_of(tr.get(keys.claim(bucket))))
            if held is not None and held[1:] == (lease, node):  # ours: an attempt that got 1021 landed
                return held[0], store.bucket_records(tr, bucket)
            if held is not None:
                if lease_expiry(tr, keys, held[2], held[1]) > version:
                    return None
                bury(tr, keys, held[2], held[1])
            if store.bucket_locked(tr, bucket, version):
                return None  # a process holds a record lock in it
            for kv in tr.get_range(keys.locks + inside, fs.prefix_end(keys.locks + inside)):
                _, other_lease, other = held_of(bytes(kv.value))  # type: ignore[misc]
                if lease_expiry(tr, keys, other, other_lease) > version:
                    return None  # a node holds a record of it
            tr.clear_range(keys.detached + inside, fs.prefix_end(keys.detached + inside))  # a dead claim's
            tr.set(keys.claim(bucket), HELD.pack(version, lease) + node)
            return version, store.bucket_records(tr, bucket)

        return store.run("node claim", body)

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        self.store.run("release request", lambda tr, _: ask(
            tr, self.store, key, owner, requester_lease, tr.get_read_version().wait(), requester))

    def _fenced(self, tr: Any, key: bytes, token: int, via_bucket: bool) -> bool:
        """The ownership ``token`` still holds ``key``, on a live lease (read: a takeover conflicts)."""
        keys = self.keys
        held = held_of(fs.value_of(tr.get(keys.claim(bucket_of(key)) if via_bucket else keys.lock(key))))
        if held is None or held[0] != token:
            return False
        if via_bucket:
            detached = fs.value_of(tr.get(keys.detach(key)))
            if detached is not None and int.from_bytes(detached, "big") == token:
                return False
        return lease_expiry(tr, keys, held[2], held[1], snapshot=True) > tr.get_read_version().wait()

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        return self._back(key, value, token, via_bucket, node, False)

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """``write_back``, and in the same transaction the record made the
        asking node's where a node's request for it stands and that node's
        lease is live (read at this read version, as its take reads its own):
        a record lock on that lease, its token this read version, above the
        holder's (whose take committed before it), as that node's take would
        have made it; its next take adopts it. One serializable transaction:
        nobody can take the record between the write-back and the lock. A
        process's request, or none, leaves the record free."""
        return self._back(key, value, token, via_bucket, node, True)

    def _back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool, node: bytes,
              hand_over: bool) -> bool:
        keys, write_id = self.keys, secrets.token_bytes(16)

        def body(tr: Any, after_unknown: bool) -> bool:
            if after_unknown and self.store.landed(tr, write_id):
                return True  # it let the ownership go: the fence below would say False
            asked = serve(tr, keys, node, key)
            if not self._fenced(tr, key, token, via_bucket):
                return False
            self.store.write_record(tr, key, value)
            self.store.sign(tr, write_id)
            if via_bucket:
                tr.set(keys.detach(key), token.to_bytes(8, "big"))
            else:
                tr.clear(keys.lock(key))
            version = tr.get_read_version().wait()
            to = asker(asked, version) if hand_over else None
            if to is not None and lease_expiry(tr, keys, to[0], to[1], snapshot=True) > version:
                tr.set(keys.lock(key), HELD.pack(version, to[1]) + to[0])  # as its own take would
            return True

        return self.store.run("node hand-over" if hand_over else "node write-back", body)

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        def body(tr: Any, _: bool) -> bool:
            if not self._fenced(tr, key, token, via_bucket):
                return False
            self.store.write_record(tr, key, value)
            return True

        return self.store.run("node write-through", body)

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        keys = self.keys

        def body(tr: Any, _: bool) -> None:
            serve(tr, keys, node, key)
            held = held_of(fs.value_of(tr.get(keys.lock(key))))
            if held is not None and held[1:] == (lease, node):
                tr.clear(keys.lock(key))

        self.store.run("node let go", body)

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        """The records in transactions under the commit limit, each fenced;
        the last one lets the claim go."""
        keys, pending = self.keys, list(records.items())
        inside = bytes([bucket])

        def body(part: list[tuple[bytes, bytes | None]], last: bool) -> Callable[[Any, bool], bool]:
            write_id = secrets.token_bytes(16)

            def run(tr: Any, after_unknown: bool) -> bool:
                if after_unknown and self.store.landed(tr, write_id):
                    return True  # the last part let the claim go: the check below would say False
                held = held_of(fs.value_of(tr.get(keys.claim(bucket))))
                if held is None or held[0] != token or lease_expiry(
                        tr, keys, held[2], held[1], snapshot=True) <= tr.get_read_version().wait():
                    return False
                for key, value in part:
                    self.store.write_record(tr, key, value)
                self.store.sign(tr, write_id)
                if last:
                    tr.clear_range(keys.detached + inside, fs.prefix_end(keys.detached + inside))
                    tr.clear(keys.claim(bucket))
                return True
            return run

        while True:
            part, size = [], 0
            while pending and (not part or size + len(pending[0][1] or b"") < RELEASE_BYTES):
                part.append(pending.pop(0))
                size += len(part[-1][0]) + len(part[-1][1] or b"")
            if not self.store.run("node bucket release", body(part, not pending)):
                return False
            if not pending:
                return True

    def owner(self, key: bytes) -> bytes | None:
        def body(tr: Any, _: bool) -> bytes | None:
            found = holder(tr, self.store, key, tr.get_read_version().wait(), snapshot=True)
            return found.node if found is not None else None

        return self.store.run("node owner", body)

    def owners(self) -> list[bytes]:
        """Every node holding a record lock or bucket claim on a live lease: one transaction."""
        keys = self.keys

        def body(tr: Any, _: bool) -> list[bytes]:
            version = tr.get_read_version().wait()
            held = {held_of(bytes(kv.value))[1:] for sub in (keys.locks, keys.claims)  # type: ignore[index]
                    for kv in tr.snapshot.get_range(sub, fs.prefix_end(sub))}
            return sorted({node for lease, node in held
                           if lease_expiry(tr, keys, node, lease, snapshot=True) > version})

        return self.store.run("node owners", body)

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        """Whether the request stands; while the requester's lease lives its
        expiry moves with that lease's, so it cannot run out unserved."""
        keys = self.keys

        def body(tr: Any, _: bool) -> bool:
            raw = fs.value_of(tr.get(keys.request(owner, key)))  # read: the agent's done() conflicts
            if raw is None:
                return False
            expiry, nonce = REQUEST.unpack_from(raw)
            lease_expires = requester_expiry(tr, keys, requester_lease)
            if lease_expires > expiry:  # the nonce and the asker stay: the agent sees no new request
                tr.set(keys.request(owner, key), REQUEST.pack(lease_expires, nonce) + raw[REQUEST.size:])
            return True

        return self.store.run("release request waiting", body)


class FdbOwnership(CalledOwnership):
    """One database's ownership operations, through ``call(method, *args)``:
    the process's store (``NodeOps``), or its relay after a fork."""

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """By name, as the other calls: the store's ``NodeOps.hand_over``
        (CalledOwnership has none, so it would fall back to a plain write-back)."""
        return bool(self._call("hand_over", key, value, token, via_bucket, node, lease))
