"""The fdb adapter's node-cache keys and the reads and writes on them
that a transaction of the store makes (``ownership.py`` and ``store.py``).

Keys, beside a database's (``<prefix>\\0<db>\\0``, see ``store.py``):

* ``n<bucket:1><enc(key)>``: a node's record lock: ``token:8 lease:8 node``;
* ``b<bucket:1>``: a node's claim on a bucket, the same format;
* ``x<bucket:1><enc(key)>``: a key detached from its bucket's claim, valued
  with that claim's token (a later claim's marks are its own);

and beside every database (``<prefix>\\0\\0``; no database name is empty):

* ``N<node>``: the node's lease, ``lease:8 expiry:8``;
* ``R<node>\\0<enc(db)><enc(key)>``: a release request to the node,
  ``expiry:8 nonce:8``, then ``lease:8 requester`` if a node asked (whom a
  hand-over gives the record to); ``Q<node>``: its doorbell, an atomic add
  in the transaction that asks and in one that removes a request (``serve``).
  The node's agent watches the doorbell (FoundationDB watches one key, not
  a range) and reads the requests when it rings. A traverse's request
  (``nodecache/sync.py``) is kept by its polls (``request_waiting``): its
  expiry follows the asking node's lease, its nonce stays, so the agent
  does not take it for a new one.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dbwrap_py.adapters.fdb import store as fs
from dbwrap_py.nodecache.layout import bucket_of

if TYPE_CHECKING:
    from dbwrap_py.adapters.fdb.store import FdbStore

HELD = struct.Struct(">qq")  # token, lease (then the node's name)
LEASE = struct.Struct(">qq")  # lease, expiry read version
REQUEST = struct.Struct(">qq")  # expiry read version, nonce (then the asking node's lease and name)
ASKER = struct.Struct(">q")  # the asking node's lease (then its name)
_ONE = (1).to_bytes(8, "little")
#: how long a release request stands; a waiter asks again well before (the node cache every 0.25 s)
REQUEST_SECONDS = 5.0


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


def held_of(raw: bytes | None) -> tuple[int, int, bytes] | None:
    if raw is None:
        return None
    token, lease = HELD.unpack_from(raw)
    return token, lease, raw[HELD.size:]


def lease_expiry(tr: Any, keys: NodeKeys, node: bytes, lease: int, snapshot: bool = False) -> int:
    """The expiry read version of ``node``'s lease ``lease``, 0 if it is not its current one."""
    raw = fs.value_of((tr.snapshot if snapshot else tr).get(keys.lease(node)))
    if raw is None:
        return 0
    current, expiry = LEASE.unpack(raw)
    return expiry if current == lease else 0


def requester_expiry(tr: Any, keys: NodeKeys, lease: int) -> int:
    """The expiry read version of the node lease ``lease``, whichever node's
    (a request does not say who asked; the cluster holds few leases), else 0."""
    for kv in tr.snapshot.get_range(keys.lease(b""), fs.prefix_end(keys.lease(b""))):
        current, expiry = LEASE.unpack(bytes(kv.value))
        if current == lease:
            return expiry
    return 0


def bury(tr: Any, keys: NodeKeys, node: bytes, lease: int) -> None:
    """A takeover from a node whose lease ran out: the lease goes too, so a
    keepalive racing this transaction conflicts instead of reviving it."""
    raw = fs.value_of(tr.get(keys.lease(node)))
    if raw is not None and LEASE.unpack(raw)[0] == lease:
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
        held = held_of(raw)
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
            bury(tr, keys, node, lease)
    return None


def ask(tr: Any, store: FdbStore, key: bytes, owner: bytes, requester_lease: int, version: int,
        requester: bytes = b"") -> None:
    """A release request to ``owner`` for ``key``, and its doorbell rung.
    A node's request names it and its lease: a hand-over gives it the record."""
    keys = store.nodes
    expiry = version + int(REQUEST_SECONDS * fs.VERSIONS_PER_SECOND)
    named = ASKER.pack(requester_lease) + requester if requester else b""
    tr.set(keys.request(owner, key), REQUEST.pack(expiry, secrets.randbits(63)) + named)
    tr.add(keys.doorbell(owner), _ONE)


def serve(tr: Any, keys: NodeKeys, node: bytes, key: bytes) -> bytes | None:
    """The release request to ``node`` for ``key`` goes; if one stood, the
    node's doorbell rings, so its agent's next round sees it gone (``Served``)
    now, not at the next request. Its value, None if there was none. (Read:
    a request made again meanwhile conflicts, and the retry serves it too.)"""
    raw = fs.value_of(tr.get(keys.request(node, key)))
    if raw is not None:
        tr.clear(keys.request(node, key))
        tr.add(keys.doorbell(node), _ONE)
    return raw


def asker(raw: bytes | None, version: int) -> tuple[bytes, int] | None:
    """(node, lease) that asked in the request ``raw``, if it is a node's and
    stands at read version ``version``; None for a process's or one run out."""
    if raw is None or len(raw) <= REQUEST.size or REQUEST.unpack_from(raw)[0] <= version:
        return None
    (lease,) = ASKER.unpack_from(raw, REQUEST.size)
    return raw[REQUEST.size + ASKER.size:], lease


def wipe(tr: Any, store: FdbStore) -> None:
    """Inside a CLEAR_IF_FIRST wipe: every node's ownership goes. Reading the
    ranges makes a take that commits meanwhile conflict with the wipe, so
    every token left standing is above the wipe's read version."""
    keys = store.nodes
    for sub in (keys.locks, keys.claims, keys.detached):
        tr.add_read_conflict_range(sub, fs.prefix_end(sub))
        tr.clear_range(sub, fs.prefix_end(sub))
