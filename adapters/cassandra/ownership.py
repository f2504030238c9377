"""The cassandra adapter's side of the node cache (dbwrap_py.nodecache.protocol):
a database's ownership operations, each decision one LWT on the bucket's
partition (its columns and statements: ``nodecql.py``; the node agent's
store: ``nodestore.py``).

Release requests: rows of ``requests`` (see ``nodestore.py``, whose agent polls them);
a node's names it (``requester``), and ``hand_over`` gives the record to that
node in its write-back's LWT.

Tokens: the database's generation (CLEAR_IF_FIRST wipes so far) above 40
random bits, so every token from before the last wipe is at most
``wipe_revision``; a write-back finds its partition by its token's
generation, so the agent needs no knowledge of the generation to fence.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.adapters.cassandra.nodecql import NO_HOLD, Hold, Leases, NodeCql, holder, parse_holder, request_ttl
from dbwrap_py.nodecache.layout import BUCKETS, bucket_of
from dbwrap_py.nodecache.ownership_base import Refused, ServedOwnership, generation_of, live_owners, new_token
from dbwrap_py.nodecache.ownership_base import take_retrying
from dbwrap_py.nodecache.ownership_base import wipe_revision as wipe_revision  # for adapter.py
from dbwrap_py.nodecache.protocol import Claim, Taken

#: seconds between an agent's reads of its release requests (option request_poll)
REQUEST_POLL = 0.05
#: buckets named in one ``bucket IN ?`` (Scylla refuses more than 100 by default)
IN_BUCKETS = 100


class CassandraOwnership(ServedOwnership):
    """One database's ownership operations on ``client`` (a process's, or the
    agent's). ``generation``: the one the process opened; None for the
    agent, which reads it where no token says it."""

    def __init__(self, client: cc.Client, name: str, generation: int | None, op_timeout: float) -> None:
        self.client = client
        self.name = name
        self.generation = generation
        self.op_timeout = op_timeout
        self.cql = NodeCql(client.config.keyspace)
        self.leases = Leases(client, self.cql)
        self._seen: dict[bytes, bytes | None] = {}  # take's guess of v, per key (small: the keys moved in)

    def _current(self) -> int:
        if self.generation is not None:
            return self.generation
        rows = self.client.run("generation", self.cql.generation, (self.name,))
        return (rows[0].generation or 0) if rows else 0

    def _pk(self, key: bytes, generation: int) -> tuple[Any, ...]:
        return f"{self.name}:{generation}", bucket_of(key), cc.stored_key(key)

    def _partition(self, bucket: int, generation: int) -> tuple[str, int]:
        return f"{self.name}:{generation}", bucket

    # -- who holds a record -------------------------------------------------------------

    def settle(self, key: bytes, hold: Hold) -> bytes | None:
        """The live node behind ``hold``; a dead lease's entry is removed
        (guarded on its token) and None returned, so the caller tries again."""
        node, lease = hold.node()
        if self.leases.live(node, lease):
            return node
        generation = self._current()
        try:
            if hold.held is not None:
                self.client.lwt("clear a dead node's lock", self.cql.unlock, (*self._pk(key, generation), hold.held))
            else:
                self.client.lwt("clear a dead node's claim", self.cql.unclaim,
                                (*self._partition(bucket_of(key), generation), hold.claim))
        except cc.OutcomeUnknown:
            pass  # the caller reads the row again
        return None

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        generation = self._current()
        guess, hold = self._seen.get(key), NO_HOLD

        def attempt() -> Taken | Refused:
            nonlocal guess, hold
            token = new_token(generation)
            args = (holder(node, lease), token, secrets.randbits(63), *self._pk(key, generation),
                    *hold.guesses(), guess)
            try:
                applied, row = self.client.lwt("take", self.cql.take, args)
            except cc.OutcomeUnknown:
                rows = self.client.run("take", self.cql.serial, self._pk(key, generation), serial=True)
                if rows and rows[0].held == token:
                    return Taken(rows[0].v, token)
                applied, row = False, None
            if applied:
                self._seen.pop(key, None)
                return Taken(guess, token)
            if row is None:
                return Refused()
            hold, guess = Hold.of(row), row.v
            return Refused(row.v, hold.held_by(), by_process=row.token is not None)

        def standing(_: object) -> bool:
            nonlocal hold
            if self.settle(key, hold) is not None:
                self._seen[key] = guess
                return True
            hold = hold.cleared()
            return False

        return take_retrying(key, node, lease, self.op_timeout, "its row", attempt, standing)

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        generation = self._current()
        where = self._partition(bucket, generation)
        rows = self.client.run("claim", self.cql.partition, where, serial=True)
        claim = rows[0].claim if rows else None
        ver = rows[0].ver if rows else None
        if claim is not None and self.leases.live(*parse_holder(rows[0].claimer)):
            return None
        records: dict[bytes, bytes] = {}
        stale: list[bytes] = []
        for row in rows:
            if row.k is None:
                continue  # the partition's static columns only
            if row.token is not None or row.held is not None:
                return None  # a process's or a node's record lock (live or not yet found dead): per record then
            if row.detached is not None:
                stale.append(row.k)  # of a dead claim
            if row.v is not None:
                records[row.k[1:]] = row.v
        token = new_token(generation)
        statements: list[tuple[str, Any]] = [
            (self.cql.claim, (token, holder(node, lease), secrets.randbits(63), *where, claim, ver))]
        statements += [(self.cql.undetach, (*where, k)) for k in stale]
        try:
            applied, _ = self.client.batch("claim", statements)
        except cc.OutcomeUnknown:
            found = self.client.run("claim", self.cql.claim_of, where, serial=True)
            applied = bool(found) and found[0].claim == token
        return Claim(token, records) if applied else None  # not applied: the partition changed meanwhile

    # -- release requests -----------------------------------------------------------------

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        # the request lives op_timeout, not the requester's lease (Cassandra's leases are
        # rows of their own), and a waiter asks again while it waits; a node names itself
        # and its lease, whom hand_over gives the record (a process asking makes it null)
        self.client.run("release request", self.cql.ask,
                        (owner.decode(), self.name, cc.stored_key(key), secrets.randbits(63),
                         holder(requester, requester_lease) if requester else None,
                         request_ttl(self.op_timeout)), idempotent=False)

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        """Whether the request stands. With half its TTL left and the
        requester's lease live it is given the TTL again, nonce kept (the
        agent sees no new request) and conditional on it, so one served
        meanwhile (a conditional delete) stays gone."""
        where = (owner.decode(), self.name, cc.stored_key(key))
        rows = self.client.run("release request waiting", self.cql.waiting, where)
        if not rows:
            return False
        ttl = request_ttl(self.op_timeout)
        if rows[0].remaining is not None and rows[0].remaining * 2 <= ttl and self.leases.of({requester_lease}):
            self.client.applied("release request kept", self.cql.keep, (ttl, rows[0].asked, *where, rows[0].asked),
                                unknown=lambda: True)  # unknown: looked at again on the next poll
        return True

    def served(self, node: bytes, key: bytes) -> None:
        self.client.run("release request served", self.cql.served, (node.decode(), self.name, cc.stored_key(key)))

    # -- writing back -------------------------------------------------------------------------

    def _fenced(self, what: str, key: bytes, token: int, cql: str, value: bytes | None,
                sets: tuple[Any, ...] = ()) -> bool:
        """``SET v = value, *sets ... IF <held or claim> = token``, with a
        receipt (the writer: the token) in the same conditional batch: an
        unknown outcome is resolved by it at SERIAL, even once the next owner
        wrote, and sent again while the token still holds."""
        pk = self._pk(key, generation_of(token))
        write_id, writer = secrets.randbits(63), f"node:{token:x}"
        deadline = time.monotonic() + self.op_timeout
        while True:
            try:
                applied, _ = self.client.batch(what, [(cql, (value, *sets, *pk, token)),
                                                      (self.cql.receipt, (writer, write_id, *pk))])
                return applied
            except cc.OutcomeUnknown:
                rows = self.client.run(what, self.cql.serial, pk, serial=True)
                if rows and (rows[0].receipts or {}).get(writer) == write_id:
                    return True
                if not rows or token not in (rows[0].held, rows[0].claim) or time.monotonic() >= deadline:
                    return False

    def write_back_fenced(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        if via_bucket:  # the key leaves the claim: detached, marked with the claim's token
            return self._fenced("write back", key, token, self.cql.back_bucket, value, (token,))
        return self._fenced("write back", key, token, self.cql.back_lock, value)

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """The write-back and, where the release request (read just before)
        names a node, that node's record lock with a new token, as its take
        sets it: one LWT. The request and the lease are rows of other
        partitions, which it cannot guard on, so both are seen to after it:
        the request goes, with any made again meanwhile (likely by that node,
        which asks again as it waits: left, it would keep the record wanted
        here); the lease is read: live then, it was live at the lock (granted
        before it asked, and a lease never comes back); else the lock comes
        off and the record stays free."""
        rows = self.client.run("hand over", self.cql.asked, (node.decode(), self.name, cc.stored_key(key)))
        asker = rows[0].requester if rows else None
        if asker is None:  # a process asked, or nobody: the record stays free
            return self.write_back(key, value, token, via_bucket, node, lease)
        fresh = token
        while fresh == token:
            fresh = new_token(generation_of(token))
        lock = (asker, fresh, secrets.randbits(63))
        if via_bucket:  # detached from the claim, as write_back_fenced does, and locked
            done = self._fenced("hand over", key, token, self.cql.hand_bucket, value, (token, *lock))
        else:
            done = self._fenced("hand over", key, token, self.cql.hand_lock, value, lock)
        self.served(node, key)
        if done and not self.leases.live(*parse_holder(asker)):
            # unknown: a lock of a dead lease is settled by whoever needs the record
            self.client.applied("hand over to a dead lease", self.cql.unlock,
                                (*self._pk(key, generation_of(token)), fresh), unknown=lambda: True)
        return done

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        cql = self.cql.through_bucket if via_bucket else self.cql.through_lock
        return self._fenced("write through", key, token, cql, value)

    def drop_lock(self, key: bytes, node: bytes, lease: int) -> None:
        pk = self._pk(key, self._current())
        rows = self.client.run("let go", self.cql.row, pk)
        if rows and rows[0].held is not None and parse_holder(rows[0].holder) == (node, lease):
            # unknown: a lock of a lease that ends is settled by whoever needs the record
            self.client.applied("let go", self.cql.unlock, (*pk, rows[0].held), unknown=lambda: True)

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        where = self._partition(bucket, generation_of(token))
        rows = self.client.run("release bucket", self.cql.partition, where)
        released = secrets.randbits(63)
        statements: list[tuple[str, Any]] = [(self.cql.release, (released, *where, token))]
        statements += [(self.cql.put, (value, *where, cc.stored_key(key))) for key, value in records.items()]
        statements += [(self.cql.undetach, (*where, row.k)) for row in rows
                       if row.k is not None and row.detached == token]
        try:
            applied, _ = self.client.batch("release bucket", statements)
        except cc.OutcomeUnknown:
            found = self.client.run("release bucket", self.cql.claim_of, where, serial=True)
            applied = bool(found) and found[0].ver == released
        return applied

    def owner(self, key: bytes) -> bytes | None:
        rows = self.client.run("owner", self.cql.row, self._pk(key, self._current()))
        if not rows:
            return None
        hold = Hold.of(rows[0])
        if hold.holds() and self.leases.live(*hold.node()):
            return hold.node()[0]
        return None

    def owners(self) -> frozenset[bytes]:
        """The holders of record locks and claims in the database's bucket
        partitions (a partition with a claim only still has its static row),
        those whose leases are live."""
        db = f"{self.name}:{self._current()}"
        holders: set[tuple[bytes, int]] = set()
        for first in range(0, BUCKETS, IN_BUCKETS):
            buckets = list(range(first, min(first + IN_BUCKETS, BUCKETS)))
            rows = self.client.pages("owners", self.cql.holders, (db, buckets))
            holders.update(parse_holder(row.holder) for row in rows if row.held is not None)
            holders.update(parse_holder(row.claimer) for row in rows if row.claim is not None)
        return live_owners(holders, lambda found: (
            node for node, _ in found & self.leases.of({lease for _, lease in found})))
