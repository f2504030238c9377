"""The rados adapter's side of the node cache (dbwrap_py.nodecache.protocol):
a database's ownership operations (the omap entries they use:
``nodenames.py``; the node agent's store: ``nodestore.py``).

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

Tokens: the database's epoch (CLEAR_IF_FIRST wipes so far) above 40 random
bits, so every token from before the last wipe is at most ``wipe_revision``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import rados

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados.nodenames import Holding, Leases, Names, all_entries, bucket_entries, guard_free, node_oid
from dbwrap_py.adapters.rados.nodenames import parse_holder, request_entry, request_holder, request_value
from dbwrap_py.errors import DbwrapError
from dbwrap_py.nodecache.ownership_base import Refused, ServedOwnership, generation_of, live_owners, new_token
from dbwrap_py.nodecache.ownership_base import take_retrying
from dbwrap_py.nodecache.ownership_base import holder_mark as holder
from dbwrap_py.nodecache.ownership_base import wipe_revision as wipe_revision  # for adapter.py
from dbwrap_py.nodecache.protocol import Claim, Taken


class RadosOwnership(ServedOwnership):
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

        def attempt() -> Taken | Refused:
            nonlocal found
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
            held = Holding.read(names, found).held_by(names)
            return Refused(found.get(names.record), held, by_process=result != -rc.ECANCELED)

        return take_retrying(key, node, lease, self.op_timeout, "its entries", attempt,
                             lambda _: self.settle(key, Holding.read(names, found)) is not None)

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        oid = f"{self.meta_oid}/{bucket % self.objects}"
        entries, version = all_entries(self.ops, oid)
        if not version:
            self.ops.write(oid, lambda op: op.new(rados.LIBRADOS_CREATE_IDEMPOTENT), "claim")
            entries, version = all_entries(self.ops, oid)
        claim, claimer = f"B{bucket:02x}", f"N{bucket:02x}"
        if claim in entries:
            owner, owner_lease = parse_holder(entries.get(claimer, b""))
            if self.leases.live(owner, owner_lease):
                return None
        found = bucket_entries(entries, bucket)
        if found is None:
            return None  # a node's record lock, live or not yet found dead: per record then
        records, stale = found
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

    # -- release requests -----------------------------------------------------------------

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        oid = node_oid(self.prefix, owner)
        entry = request_entry(self.db_id, key)
        asked = request_value(requester, requester_lease)
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

    def write_back_fenced(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                          to: tuple[bytes, int] | None = None) -> bool:
        """With ``to`` (a node, its lease), the same op makes the record that
        node's: its record lock on a new token, as its own take would set it
        (of the holder's token's generation: the agent's ownership knows no epoch)."""
        names = Names.of(key)
        given = token
        while to is not None and given == token:
            given = new_token(max(self.epoch, generation_of(token)))

        def change(op: rados.WriteOp) -> None:
            self._store(op, names, value)
            if via_bucket:
                self.ops.io.set_omap(op, [names.detached], [b"%x" % token])
            elif to is None:
                self.ops.io.remove_omap_keys(op, [names.lock, names.who])
            if to is not None:
                self.ops.io.set_omap(op, [names.lock, names.who], [b"%x" % given, holder(*to)])

        return self.end(key, lambda op: self._fence(op, names, token, via_bucket), change,
                        "hand over" if to is not None else "write back")

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """No op spans the request (on the node's object) and the record (on
        its own), so: the request read; the record written back and made its
        asker's in one op fenced on ``token``, so nobody takes it in between;
        then the request removed, guarded on its value (a request made again
        stands, for the agent to serve). The asker holds the record after two
        round trips, as on etcd; the removal is the holder's alone. The
        asker's lease is not asked of the OSD: one that died leaves a lock
        like its own take just before it died, which ``settle`` clears. The
        holder's chainlock keeps its node's processes out meanwhile."""
        oid, entry = node_oid(self.prefix, node), request_entry(self.db_id, key)
        asked = self.ops.read(oid, [entry], "hand over").get(entry)
        if asked is None:  # nobody asks (any more): the record stays free
            return self.write_back_fenced(key, value, token, via_bucket)
        done = self.write_back_fenced(key, value, token, via_bucket, request_holder(asked))
        try:
            self.ops.write(oid, lambda op: (
                op.omap_cmp(entry, asked.decode(), rados.LIBRADOS_CMPXATTR_OP_EQ),
                self.ops.io.remove_omap_keys(op, [entry])), "release request served")
        except DbwrapError:  # the record is handed over all the same: the node must forget it
            pass  # the request stays, and the agent, finding the record gone, removes it (let_go)
        return done

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        names = Names.of(key)
        return self.ops.write(self.oid_of(key), lambda op: (self._fence(op, names, token, via_bucket),
                                                            self._store(op, names, value)),
                              "write through") == 0

    def drop_lock(self, key: bytes, node: bytes, lease: int) -> None:
        names = Names.of(key)
        found = self.ops.read(self.oid_of(key), [names.lock, names.who], "let go")
        if names.lock in found and parse_holder(found.get(names.who, b"")) == (node, lease):
            token = int(found[names.lock], 16)
            self.end(key, lambda op: self._fence(op, names, token, False),
                     lambda op: self.ops.io.remove_omap_keys(op, [names.lock, names.who]), "let go")

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        oid = f"{self.meta_oid}/{bucket % self.objects}"
        claim, claimer = f"B{bucket:02x}", f"N{bucket:02x}"
        detached = [name for name, value in all_entries(self.ops, oid)[0].items()
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
        return live_owners(holders, lambda found: (node for node, lease in found if self.leases.live(node, lease)))

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        # requests here do not expire: gone is served
        entry = request_entry(self.db_id, key)
        return entry in self.ops.read(node_oid(self.prefix, owner), [entry], "release request waiting")
