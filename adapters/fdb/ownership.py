"""The fdb adapter's side of the node cache (dbwrap_py.nodecache.protocol).

Keys, beside a database's (``<prefix>\\0<db>\\0``, see ``store.py``):

* ``n<bucket:1><enc(key)>``: a node's record lock: ``token:8 lease:8 node``;
* ``b<bucket:1>``: a node's claim on a bucket, the same format;
* ``x<bucket:1><enc(key)>``: a key detached from its bucket's claim, valued
  with that claim's token (a later claim's marks are its own);

and beside every database (``<prefix>\\0\\0``; no database name is empty):

* ``N<node>``: the node's lease, ``lease:8 expiry:8``;
* ``R<node>\\0<enc(db)><enc(key)>``: a release request to the node,
  ``expiry:8 nonce:8``; ``Q<node>``: its doorbell, an atomic add in the
  transaction that asks. The node's agent watches the doorbell (FoundationDB
  watches one key, not a range) and reads the requests when it rings. A
  traverse's request (``nodecache/sync.py``) is kept by its polls
  (``request_waiting``): its expiry follows the asking node's lease, its
  nonce stays, so the agent does not take it for a new one.

A node lease's expiry is a read version, as a record lock's: the cluster
judges it, never a node's clock. A node owns what it holds while its lease
is live at the reading transaction's read version. Tokens are the read
version of the transaction that took the ownership: a CLEAR_IF_FIRST wipe
reads the node keys it clears, so a take that commits after it read at a
version above the wipe's (``FdbStore.wipe_revision``), and tokens up to it
are void. Each write-back reads the key that holds the ownership, so a
takeover and a write-back of the same record conflict; a takeover from a
node whose lease ran out also clears that lease, so the node's keepalive,
which reads it, cannot revive it past the takeover.
"""

from __future__ import annotations

import secrets
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dbwrap_py.adapters.fdb import store as fs
from dbwrap_py.errors import FencedOut
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import (
    CalledOwnership,
    PerDatabase,
    elsewhere,
    grant_retrying,
    new_requests,
    taken,
)
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore

if TYPE_CHECKING:
    from dbwrap_py.adapters.fdb.store import FdbStore

_HELD = struct.Struct(">qq")  # token, lease (then the node's name)
_LEASE = struct.Struct(">qq")  # lease, expiry read version
_REQUEST = struct.Struct(">qq")  # expiry read version, nonce
_ONE = (1).to_bytes(8, "little")
#: how long a release request stands; a waiter asks again well before (the node cache every 0.25 s)
REQUEST_SECONDS = 5.0
#: what a bucket's write-back commits per transaction, under FoundationDB's 10,000,000 bytes
RELEASE_BYTES = 4_000_000
#: how long the agent waits on its doorbell before it looks at the stop flag
DOORBELL_SLICE = 0.5


class NodeKeys:
    """The node cache's keys of one database, and those beside every database."""

    def __init__(self, prefix: bytes, base: bytes) -> None:
        self.locks, self.claims, self.detached = base + b"n", base + b"b", base + b"x"
        self.shared = prefix + b"\0\0"
        self.db = base[len(prefix) + 1:-1]

    def lock(self, key: bytes) -> bytes:
        return self.locks + fs.bucket_byte(key) + fs.encode(key)

    def claim(self, bucket: int) -> bytes:
        return self.claims + bytes([bucket])

    def detach(self, key: bytes) -> bytes:
        return self.detached + fs.bucket_byte(key) + fs.encode(key)

    def lease(self, node: bytes) -> bytes:
        return self.shared + b"N" + node

    def requests(self, node: bytes) -> bytes:
        return self.shared + b"R" + node + b"\0"

    def request(self, node: bytes, key: bytes) -> bytes:
        return self.requests(node) + fs.encode(self.db) + fs.encode(key)

    def doorbell(self, node: bytes) -> bytes:
        return self.shared + b"Q" + node


def _held(raw: bytes | None) -> tuple[int, int, bytes] | None:
    if raw is None:
        return None
    token, lease = _HELD.unpack_from(raw)
    return token, lease, raw[_HELD.size:]


def lease_expiry(tr: Any, keys: NodeKeys, node: bytes, lease: int, snapshot: bool = False) -> int:
    """The expiry read version of ``node``'s lease ``lease``, 0 if it is not its current one."""
    raw = fs.value_of((tr.snapshot if snapshot else tr).get(keys.lease(node)))
    if raw is None:
        return 0
    current, expiry = _LEASE.unpack(raw)
    return expiry if current == lease else 0


def requester_expiry(tr: Any, keys: NodeKeys, lease: int) -> int:
    """The expiry read version of the node lease ``lease``, whichever node's
    (a request does not say who asked; the cluster holds few leases), else 0."""
    for kv in tr.snapshot.get_range(keys.lease(b""), fs.prefix_end(keys.lease(b""))):
        current, expiry = _LEASE.unpack(bytes(kv.value))
        if current == lease:
            return expiry
    return 0


def _bury(tr: Any, keys: NodeKeys, node: bytes, lease: int) -> None:
    """A takeover from a node whose lease ran out: the lease goes too, so a
    keepalive racing this transaction conflicts instead of reviving it."""
    raw = fs.value_of(tr.get(keys.lease(node)))
    if raw is not None and _LEASE.unpack(raw)[0] == lease:
        tr.clear(keys.lease(node))


@dataclass(frozen=True)
class Holder:
    """A live node's ownership of a record."""

    node: bytes
    lease: int
    token: int
    via_bucket: bool
    expiry: int  # the lease's, a read version
    watch_keys: list[bytes]  # what changes when the node lets go


def holder(tr: Any, store: FdbStore, key: bytes, version: int, snapshot: bool = False) -> Holder | None:
    """The live node that owns ``key``, by record lock or by bucket; a dead
    node's ownership is buried (unless ``snapshot``: a read only looks)."""
    keys = store.nodes
    reader = tr.snapshot if snapshot else tr
    lock_key, claim_key, detach_key = keys.lock(key), keys.claim(bucket_of(key)), keys.detach(key)
    futures = [reader.get(k) for k in (lock_key, claim_key, detach_key)]  # in flight together
    lock, claim, detached = (fs.value_of(future) for future in futures)
    for raw, via_bucket in ((lock, False), (claim, True)):
        held = _held(raw)
        if held is None:
            continue
        token, lease, node = held
        if via_bucket and detached is not None and int.from_bytes(detached, "big") == token:
            continue  # handed out of the claim: owned record by record now
        expiry = lease_expiry(tr, keys, node, lease, snapshot)
        if expiry > version:
            watch = [lock_key] if not via_bucket else [detach_key, claim_key]
            return Holder(node, lease, token, via_bucket, expiry, watch)
        if not snapshot:
            _bury(tr, keys, node, lease)
    return None


def ask(tr: Any, store: FdbStore, key: bytes, owner: bytes, requester_lease: int, version: int) -> None:
    """A release request to ``owner`` for ``key``, and its doorbell rung."""
    keys = store.nodes
    expiry = version + int(REQUEST_SECONDS * fs.VERSIONS_PER_SECOND)
    tr.set(keys.request(owner, key), _REQUEST.pack(expiry, secrets.randbits(63)))
    tr.add(keys.doorbell(owner), _ONE)


def wipe(tr: Any, store: FdbStore) -> None:
    """Inside a CLEAR_IF_FIRST wipe: every node's ownership goes. Reading the
    ranges makes a take that commits meanwhile conflict with the wipe, so
    every token left standing is above the wipe's read version."""
    keys = store.nodes
    for sub in (keys.locks, keys.claims, keys.detached):
        tr.add_read_conflict_range(sub, fs.prefix_end(sub))
        tr.clear_range(sub, fs.prefix_end(sub))


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
            tr.set(self.keys.lock(key), _HELD.pack(version, lease) + node)
            return taken(value, version)

        return store.run("node take", body)

    def claim(self, bucket: int, node: bytes, lease: int) -> tuple[int, dict[bytes, bytes]] | None:
        store, keys = self.store, self.keys
        inside = bytes([bucket])

        def body(tr: Any, _: bool) -> tuple[int, dict[bytes, bytes]] | None:
            version = self._own_lease(tr, node, lease)
            held = _held(fs.value_of(tr.get(keys.claim(bucket))))
            if held is not None and held[1:] == (lease, node):  # ours: an attempt that got 1021 landed
                return held[0], store.bucket_records(tr, bucket)
            if held is not None:
                if lease_expiry(tr, keys, held[2], held[1]) > version:
                    return None
                _bury(tr, keys, held[2], held[1])
            if store.bucket_locked(tr, bucket, version):
                return None  # a process holds a record lock in it
            for kv in tr.get_range(keys.locks + inside, fs.prefix_end(keys.locks + inside)):
                _, other_lease, other = _held(bytes(kv.value))  # type: ignore[misc]
                if lease_expiry(tr, keys, other, other_lease) > version:
                    return None  # a node holds a record of it
            tr.clear_range(keys.detached + inside, fs.prefix_end(keys.detached + inside))  # a dead claim's
            tr.set(keys.claim(bucket), _HELD.pack(version, lease) + node)
            return version, store.bucket_records(tr, bucket)

        return store.run("node claim", body)

    def request_release(self, key: bytes, owner: bytes, requester_lease: int) -> None:
        self.store.run("release request", lambda tr, _: ask(
            tr, self.store, key, owner, requester_lease, tr.get_read_version().wait()))

    def _fenced(self, tr: Any, key: bytes, token: int, via_bucket: bool) -> bool:
        """The ownership ``token`` still holds ``key``, on a live lease (read: a takeover conflicts)."""
        keys = self.keys
        held = _held(fs.value_of(tr.get(keys.claim(bucket_of(key)) if via_bucket else keys.lock(key))))
        if held is None or held[0] != token:
            return False
        if via_bucket:
            detached = fs.value_of(tr.get(keys.detach(key)))
            if detached is not None and int.from_bytes(detached, "big") == token:
                return False
        return lease_expiry(tr, keys, held[2], held[1], snapshot=True) > tr.get_read_version().wait()

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        keys, write_id = self.keys, secrets.token_bytes(16)

        def body(tr: Any, after_unknown: bool) -> bool:
            if after_unknown and self.store.landed(tr, write_id):
                return True  # it let the ownership go: the fence below would say False
            tr.clear(keys.request(node, key))
            if not self._fenced(tr, key, token, via_bucket):
                return False
            self.store.write_record(tr, key, value)
            self.store.sign(tr, write_id)
            if via_bucket:
                tr.set(keys.detach(key), token.to_bytes(8, "big"))
            else:
                tr.clear(keys.lock(key))
            return True

        return self.store.run("node write-back", body)

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
            tr.clear(keys.request(node, key))
            held = _held(fs.value_of(tr.get(keys.lock(key))))
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
                held = _held(fs.value_of(tr.get(keys.claim(bucket))))
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
            held = {_held(bytes(kv.value))[1:] for sub in (keys.locks, keys.claims)  # type: ignore[index]
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
            expiry, nonce = _REQUEST.unpack(raw)
            lease_expires = requester_expiry(tr, keys, requester_lease)
            if lease_expires > expiry:  # the nonce stays: the agent sees no new request
                tr.set(keys.request(owner, key), _REQUEST.pack(lease_expires, nonce))
            return True

        return self.store.run("release request waiting", body)


class FdbOwnership(CalledOwnership):
    """One database's ownership operations, through ``call(method, *args)``:
    the process's store (``NodeOps``), or its relay after a fork."""


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
            if raw is not None and _LEASE.unpack(raw)[1] > version:
                return False
            tr.set(keys.lease(node), _LEASE.pack(lease, version + int(ttl * fs.VERSIONS_PER_SECOND)))
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
            tr.set(keys.lease(node), _LEASE.pack(lease.id, version + int(lease.ttl * fs.VERSIONS_PER_SECOND)))
            return lease.ttl

        return self.shared.run("node keepalive", body)

    def revoke(self, lease: NodeLease) -> None:
        keys, node = self.shared.nodes, self._nodes[lease.id]

        def body(tr: Any, _: bool) -> None:
            if lease_expiry(tr, keys, node, lease.id):
                tr.clear(keys.lease(node))

        self.shared.run("node revoke", body)

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes]]:
        """The requests standing, then each new one when the doorbell rings
        (a watch on it, set in the transaction that read them)."""
        keys = self.shared.nodes
        begin = keys.requests(node)
        doorbell: list[Any] = []  # the watch set by the last read

        def body(tr: Any, _: bool) -> dict[tuple[bytes, int], tuple[bytes, bytes]]:
            # by (request key, nonce): a request asked again is new, one kept alive (request_waiting) is not
            version, found = tr.get_read_version().wait(), {}
            for kv in tr.get_range(begin, fs.prefix_end(begin)):
                expiry, nonce = _REQUEST.unpack(bytes(kv.value))
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
        self.shared.run("release request served", lambda tr, _: tr.clear(keys.request(node, key)))

    def database(self, db_id: bytes) -> FdbOwnership:
        store = self._store(db_id)
        return FdbOwnership(lambda method, *args: store.ownership(method, *args), self.op_timeout)

    def close(self) -> None:
        for store in self._store.take_all():
            store.close()
