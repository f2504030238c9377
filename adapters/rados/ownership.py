"""The rados adapter's side of the node cache (dbwrap_py.nodecache.protocol).

A bucket's records live in one object (``record_oid`` places keys by
bucket), and so does everything that says who owns them, as omap entries
beside the records (``<key>``: percent-encoded, ``<bb>``: the bucket in hex):

    o<key>  the token of a node's record lock       n<key>  its holder, "node:lease"
    B<bb>   the token of a node's bucket claim      N<bb>   its holder
    d<key>  the key was detached from the claim whose token it holds

A process's own record lock (the adapter without the cache) is cls_lock
``r<bb><digest>`` on the same object. So every decision about a record is
one op on one object: a take is refused by a held process lock (a lock
taken and dropped in the op), by ``o<key>``, or by a claim the key is not
detached from; a claim is refused unless the object is unchanged since it
looked (``assert_version``); every write-back compares the entry that holds
the ownership with its token (omap_cmp), so a node that lost it writes nothing.

Node leases: cls_lock ``lease`` on ``<prefix>/_nodes/<node>``, cookie the
lease id, held for the TTL and renewed with LOCK_MUST_RENEW: the OSD judges
expiry, and an expired lease stays dead. An entry of a dead lease stays
until someone who needs the record asks the OSD (cls_lock get_info), finds
the lease gone, and removes the entry guarded on its token.

Release requests: omap entries ``q<db>/<key>`` on the owner's node object
(valued by a nonce: a request made again is a new one), then a notify on
it; the agent watches the object and reads the entries.

Tokens: the database's epoch (CLEAR_IF_FIRST wipes so far) above 40 random
bits, so every token from before the last wipe is at most ``wipe_revision``.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import rados

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.errors import Timeout, Unavailable
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import PerDatabase, attempts, grant_retrying, new_requests, new_token
from dbwrap_py.nodecache.ownership_base import holder_mark as holder
from dbwrap_py.nodecache.ownership_base import parse_holder_mark as parse_holder
from dbwrap_py.nodecache.ownership_base import wipe_revision as wipe_revision  # for adapter.py
from dbwrap_py.nodecache.protocol import Claim, NodeLease, NodeStore, OwnedElsewhere, Ownership, Taken

#: how often an agent reads its requests even without a notify (a lost watch)
REQUESTS_POLL = 1.0
#: the node lease's cls_lock
LEASE_LOCK = "lease"


def node_oid(prefix: str, node: bytes) -> str:
    return f"{prefix}/_nodes/{node.decode()}"


@dataclass(frozen=True)
class Names:
    """The omap entries of one key (see the module docstring)."""

    record: str
    lock: str
    who: str
    claim: str
    claimer: str
    detached: str
    waiter: str

    @classmethod
    def of(cls, key: bytes) -> "Names":
        name, bucket = rc.encode_key(key), f"{bucket_of(key):02x}"
        return cls("k" + name, "o" + name, "n" + name, "B" + bucket, "N" + bucket, "d" + name, "w" + name)

    def all(self) -> list[str]:
        return [self.record, self.lock, self.who, self.claim, self.claimer, self.detached]


@dataclass(frozen=True)
class Holding:
    """Who holds a record, from its entries: a node's record lock, else a
    claim the key is not detached from, else nobody."""

    entry: str          # "" (nobody), Names.lock or Names.claim
    token: bytes = b""
    node: bytes = b""
    lease: int = 0

    @classmethod
    def read(cls, names: Names, found: Mapping[str, bytes]) -> "Holding":
        if names.lock in found:
            return cls(names.lock, found[names.lock], *parse_holder(found.get(names.who, b"")))
        claim = found.get(names.claim)
        if claim is not None and found.get(names.detached) != claim:
            return cls(names.claim, claim, *parse_holder(found.get(names.claimer, b"")))
        return cls("")


def guard_free(op: rados.WriteOp, names: Names, found: Mapping[str, bytes]) -> None:
    """Fail the op unless the record is still as free as ``found`` says:
    no record lock, and no claim, or the same claim it was detached from."""
    eq = rados.LIBRADOS_CMPXATTR_OP_EQ
    op.omap_cmp(names.lock, "", eq)
    op.omap_cmp(names.claim, found.get(names.claim, b"").decode(), eq)
    op.omap_cmp(names.detached, found.get(names.detached, b"").decode(), eq)


class Leases:
    """Whether a node lease is live, as the OSD says (cls_lock get_info)."""

    def __init__(self, ops: rc.Ops, prefix: str) -> None:
        self.ops = ops
        self.prefix = prefix

    def live(self, node: bytes, lease: int) -> bool:
        return f"{lease:x}" in self.ops.lock_holders(node_oid(self.prefix, node), LEASE_LOCK, "node lease")


class RadosOwnership(Ownership):
    """One database's ownership operations, on ``ops`` (a process's client, or the agent's)."""

    def __init__(self, ops: rc.Ops, prefix: str, meta_oid: str, db_id: bytes, objects: int,
                 epoch: int, op_timeout: float) -> None:
        self.ops = ops
        self.prefix = prefix
        self.meta_oid = meta_oid
        self.db_id = db_id
        self.objects = objects
        self.epoch = epoch
        self.op_timeout = op_timeout
        self.leases = Leases(ops, prefix)

    def oid_of(self, key: bytes) -> str:
        return rc.record_oid(self.meta_oid, self.objects, key)

    # -- who holds a record -------------------------------------------------------------

    def settle(self, key: bytes, holding: Holding) -> bytes | None:
        """The live node behind ``holding``; a dead lease's entry is removed
        (guarded on its token) and None returned, so the caller tries again."""
        if self.leases.live(holding.node, holding.lease):
            return holding.node
        names = Names.of(key)
        who = names.who if holding.entry == names.lock else names.claimer

        def clear(op: rados.WriteOp) -> None:
            op.omap_cmp(holding.entry, holding.token.decode(), rados.LIBRADOS_CMPXATTR_OP_EQ)
            self.ops.io.remove_omap_keys(op, [holding.entry, who])

        self.ops.write(self.oid_of(key), clear, "clear a dead node's hold")
        return None

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        names, oid = Names.of(key), self.oid_of(key)
        found: dict[str, bytes] = {}
        for _ in attempts(self.op_timeout, f"take {key!r}: its entries"):
            token = new_token(self.epoch)

            def build(op: rados.WriteOp) -> None:
                # a process's lock on the record refuses the op (EBUSY); else
                # the lock is taken and dropped again within it
                op.execute("lock", "lock", rc.lock_op(rc.lock_name(key), "node-take", 1.0))
                op.rm_xattr(rc.lock_xattr(rc.lock_name(key)))
                guard_free(op, names, found)
                self.ops.io.set_omap(op, [names.lock, names.who], [b"%x" % token, holder(node, lease)])

            result, found = self.ops.write_read(oid, build, names.all(), "take")
            if result == 0:
                return Taken(found.get(names.record), token)
            if result != -rc.ECANCELED:
                raise OwnedElsewhere(None, f"{key!r} is locked by a process")
            held = Holding.read(names, found)
            if held.entry and (held.node, held.lease) == (node, lease):
                # ours: a taker of ours died before keeping it, or the node's bucket
                return Taken(found.get(names.record), int(held.token, 16), via_bucket=held.entry == names.claim)
            if held.entry:
                owner = self.settle(key, held)
                if owner is not None:
                    raise OwnedElsewhere(owner, f"{key!r} is held by node {owner.decode()}")
            # else free (a dead hold removed, or detached): again, guarded on what was read

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        oid = f"{self.meta_oid}/{bucket % self.objects}"
        entries, version = self._entries(oid)
        if not version:
            self.ops.write(oid, lambda op: op.new(rados.LIBRADOS_CREATE_IDEMPOTENT), "claim")
            entries, version = self._entries(oid)
        claim, claimer = f"B{bucket:02x}", f"N{bucket:02x}"
        if claim in entries:
            owner, owner_lease = parse_holder(entries.get(claimer, b""))
            if self.leases.live(owner, owner_lease):
                return None
        records: dict[bytes, bytes] = {}
        stale: list[str] = [name for name in (claim, claimer) if name in entries]
        for name, value in entries.items():
            kind, key = name[0], rc.decode_key(name[1:]) if name[0] in "kond" else b""
            if kind not in "kond" or bucket_of(key) != bucket:
                continue
            if kind == "k":
                records[key] = value
            elif kind == "o":
                return None  # a node's record lock, live or not yet found dead: per record then
            elif kind == "d":
                stale.append(name)  # of the dead claim
        with rc.translated("claim"):
            attrs = dict(self.ops.io.get_xattrs(oid))
        self.ops.round_trips += 1
        if any(name.startswith(rc.bucket_locks(bucket)) for name in attrs):
            return None  # a process's lock (perhaps expired: the OSD has not said)
        token = new_token(self.epoch)

        def build(op: rados.WriteOp) -> None:
            op.assert_version(version)
            if stale:
                self.ops.io.remove_omap_keys(op, stale)
            self.ops.io.set_omap(op, [claim, claimer], [b"%x" % token, holder(node, lease)])

        if self.ops.write(oid, build, "claim") != 0:
            return None  # the object changed meanwhile
        return Claim(token, records)

    def _entries(self, oid: str) -> tuple[dict[str, bytes], int]:
        """Every omap entry of ``oid`` and the version they are of (0: no object)."""
        entries: dict[str, bytes] = {}
        after, version = "", 0
        while True:
            page, seen = self.ops.page(oid, after, "", "claim")
            version = version or seen
            entries.update(page)
            if len(page) < rc.OMAP_PAGE:
                return entries, version
            after = page[-1][0]

    # -- release requests -----------------------------------------------------------------

    def request_release(self, key: bytes, owner: bytes, requester_lease: int) -> None:
        oid = node_oid(self.prefix, owner)
        entry = request_entry(self.db_id, key)
        asked = b"%x" % secrets.randbits(63)  # a request made again is a new one
        self.ops.write(oid, lambda op: (op.new(rados.LIBRADOS_CREATE_IDEMPOTENT),
                                        self.ops.io.set_omap(op, [entry], [asked])), "release request")
        self.ops.notify(oid, entry, "release request")

    def served(self, node: bytes, key: bytes) -> None:
        entry = request_entry(self.db_id, key)
        self.ops.write(node_oid(self.prefix, node), lambda op: self.ops.io.remove_omap_keys(op, [entry]),
                       "release request served")

    # -- writing back -------------------------------------------------------------------------

    def _fence(self, op: rados.WriteOp, names: Names, token: int, via_bucket: bool) -> None:
        op.omap_cmp(names.claim if via_bucket else names.lock, f"{token:x}", rados.LIBRADOS_CMPXATTR_OP_EQ)

    def _store(self, op: rados.WriteOp, names: Names, value: bytes | None) -> None:
        if value is None:
            self.ops.io.remove_omap_keys(op, [names.record])
        else:
            self.ops.io.set_omap(op, [names.record], [value])

    def end(self, key: bytes, fence: Callable[[rados.WriteOp], None],
            change: Callable[[rados.WriteOp], None], what: str) -> bool:
        """An op that ends an ownership: ``fence``, then ``change``; a waiter's
        mark fails it, and it is sent again clearing the mark, then the
        object is notified (the direct adapter's waiters sleep on it)."""
        names, oid = Names.of(key), self.oid_of(key)

        def build(op: rados.WriteOp, waiters: bool) -> None:
            fence(op)
            if waiters:
                self.ops.io.remove_omap_keys(op, [names.waiter])
            else:
                op.omap_cmp(names.waiter, "", rados.LIBRADOS_CMPXATTR_OP_EQ)
            change(op)

        result = self.ops.write(oid, lambda op: build(op, False), what)
        if result == -rc.ECANCELED:
            result = self.ops.write(oid, lambda op: build(op, True), what)
            if result == 0:
                self.ops.notify(oid, names.record, what)
        return result == 0

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        names = Names.of(key)

        def change(op: rados.WriteOp) -> None:
            self._store(op, names, value)
            if via_bucket:
                self.ops.io.set_omap(op, [names.detached], [b"%x" % token])
            else:
                self.ops.io.remove_omap_keys(op, [names.lock, names.who])

        done = self.end(key, lambda op: self._fence(op, names, token, via_bucket), change, "write back")
        self.served(node, key)
        return done

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        names = Names.of(key)
        return self.ops.write(self.oid_of(key), lambda op: (self._fence(op, names, token, via_bucket),
                                                            self._store(op, names, value)),
                              "write through") == 0

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        names = Names.of(key)
        found = self.ops.read(self.oid_of(key), [names.lock, names.who], "let go")
        if names.lock in found and parse_holder(found.get(names.who, b"")) == (node, lease):
            token = int(found[names.lock], 16)
            self.end(key, lambda op: self._fence(op, names, token, False),
                     lambda op: self.ops.io.remove_omap_keys(op, [names.lock, names.who]), "let go")
        self.served(node, key)

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        oid = f"{self.meta_oid}/{bucket % self.objects}"
        claim, claimer = f"B{bucket:02x}", f"N{bucket:02x}"
        detached = [name for name, value in self._entries(oid)[0].items()
                    if name.startswith("d") and value == b"%x" % token]
        puts = [(Names.of(k).record, v) for k, v in records.items() if v is not None]
        deletes = [Names.of(k).record for k, v in records.items() if v is None]

        def build(op: rados.WriteOp) -> None:
            op.omap_cmp(claim, f"{token:x}", rados.LIBRADOS_CMPXATTR_OP_EQ)
            if puts:
                self.ops.io.set_omap(op, [k for k, _ in puts], [v for _, v in puts])
            self.ops.io.remove_omap_keys(op, [*deletes, *detached, claim, claimer])

        return self.ops.write(oid, build, "release bucket") == 0

    def owner(self, key: bytes) -> bytes | None:
        names = Names.of(key)
        held = Holding.read(names, self.ops.read(self.oid_of(key), names.all(), "owner"))
        if held.entry and self.leases.live(held.node, held.lease):
            return held.node
        return None

    def owners(self) -> frozenset[bytes]:
        """The holders of record locks (``n<key>``) and claims (``N<bb>``)
        in every object, read together, whose leases are live (the OSD asked once per holder)."""
        reads = [(f"{self.meta_oid}/{i}", "", prefix) for i in range(self.objects) for prefix in "nN"]
        holders: set[tuple[bytes, int]] = set()
        while reads:
            pages = self.ops.pages_together(reads, "owners")
            holders.update(parse_holder(value) for page in pages for _, value in page)
            reads = [(oid, page[-1][0], prefix) for (oid, _, prefix), page in zip(reads, pages)
                     if len(page) == rc.OMAP_PAGE]
        return frozenset(node for node, lease in holders if self.leases.live(node, lease))

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        # requests here do not expire: gone is served
        entry = request_entry(self.db_id, key)
        return entry in self.ops.read(node_oid(self.prefix, owner), [entry], "release request waiting")


def request_entry(db_id: bytes, key: bytes) -> str:
    return f"q{rc.encode_key(db_id)}/{rc.encode_key(key)}"


def parse_request(entry: str) -> tuple[bytes, bytes] | None:
    db, slash, key = entry[1:].partition("/")
    return (rc.decode_key(db), rc.decode_key(key)) if entry.startswith("q") and slash else None


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

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes]]:
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
