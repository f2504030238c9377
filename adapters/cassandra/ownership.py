"""The cassandra adapter's side of the node cache (dbwrap_py.nodecache.protocol).

An LWT conditions on one partition only, so a database in the node cache's
layout (``layout = buckets``, the default with ``node_cache``) keeps a
bucket's records in one partition of ``node_volatile`` (PRIMARY KEY ((db,
bucket), k)), beside everything that says who owns them:

    per record (row)   v, and a process's record lock: owner, "token" (TTL
                       cells, as in the per-record layout), receipts (by writer)
                       a node's record lock: holder ("node:lease"), held (its token)
                       detached: the token of the claim the key was handed out of
    per bucket         claim (the token of a node's bucket claim), claimer,
    (static)           ver: set by every take, so that a claim, guarded on the
                       ver it read, fails if any record was locked since

So every decision about a record is one LWT on one partition: a take (a
node's or a process's) is refused by a live process lock (``"token" =
null``), by a node's record lock (``held = null``) or by a claim the key was
not detached from (the claim and detached values it read, as guesses); a
claim is refused unless the partition's ``ver`` and ``claim`` are as it read
them, with no lock in any row; every write-back, write-through and bucket
release is conditional on the token that holds the ownership (``IF held =``
or ``IF claim =``), so a node that lost it writes nothing.

Node leases: table ``nodes`` (name PRIMARY KEY, lease), the lease cell
written ``USING TTL`` by ``IF NOT EXISTS`` and renewed ``IF lease = <ours>``:
Cassandra judges expiry, and an expired lease stays dead (the condition
fails on the expired cell). An entry of a dead lease stays until someone
who needs the record reads ``nodes``, finds that lease gone, and removes
the entry with an LWT guarded on its token.

Release requests: table ``requests`` (PRIMARY KEY (node, db, k)), written
``USING TTL`` op_timeout with a nonce (a request made again is a new one);
Cassandra has no watch, so the agent polls its node's partition every
``request_poll`` seconds (bench/cassandra_request_poll.py measures the cost).
A traverse's request (``nodecache/sync.py``) is answered by a conditional
delete and kept, while the asking node's lease lives, by an LWT on the nonce
its poll read: a served request is never revived.

Tokens: the database's generation (CLEAR_IF_FIRST wipes so far) above 40
random bits, so every token from before the last wipe is at most
``wipe_revision``; a write-back finds its partition by its token's
generation, so the agent needs no knowledge of the generation to fence.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.errors import Timeout
from dbwrap_py.nodecache.layout import BUCKETS, bucket_of
from dbwrap_py.nodecache.ownership_base import (
    PerDatabase,
    attempts,
    generation_of,
    grant_retrying,
    holder_mark,
    new_requests,
    new_token,
    parse_holder_mark,
)
from dbwrap_py.nodecache.ownership_base import wipe_revision as wipe_revision  # for adapter.py
from dbwrap_py.nodecache.protocol import Claim, NodeLease, NodeStore, OwnedElsewhere, Ownership, Taken

#: seconds between an agent's reads of its release requests (option request_poll)
REQUEST_POLL = 0.05
#: Cassandra's TTLs are whole seconds and expire on a whole second: a lease
#: may end up to this much before the time it was granted for
TTL_GRANULARITY = 1
#: buckets named in one ``bucket IN ?`` (Scylla refuses more than 100 by default)
IN_BUCKETS = 100


def holder(node: bytes, lease: int) -> str:
    return holder_mark(node, lease).decode()


def parse_holder(value: str | None) -> tuple[bytes, int]:
    return parse_holder_mark((value or "").encode())


def request_ttl(op_timeout: float) -> int:
    """A release request's TTL, whole seconds."""
    return max(1, math.ceil(op_timeout))


@dataclass(frozen=True)
class Hold:
    """Who holds a record by the node cache, from its row: a node's record
    lock (``held``), else a claim the key is not detached from, else nobody.
    Its fields are also a take's guesses of those cells."""

    held: int | None = None
    holder: str | None = None
    claim: int | None = None
    claimer: str | None = None
    detached: int | None = None

    @classmethod
    def of(cls, row: Any, read: bool = False) -> "Hold":
        """From a row that has these columns (a not-applied take returns them;
        ``read``: a plain read, which has held, claim and detached only)."""
        if read:
            return cls(row.held, None, row.claim, None, row.detached)
        return cls(row.held, row.holder, row.claim, row.claimer, row.detached)

    def holds(self) -> bool:
        return self.held is not None or self.by_claim()

    def by_claim(self) -> bool:
        return self.held is None and self.claim is not None and self.detached != self.claim

    def node(self) -> tuple[bytes, int]:
        return parse_holder(self.holder if self.held is not None else self.claimer)

    def token(self) -> int:
        return self.held if self.held is not None else self.claim  # type: ignore[return-value]

    def guesses(self) -> tuple[Any, ...]:
        """For ``held = null AND holder = ? AND claim = ? AND claimer = ? AND detached = ?``."""
        return self.holder, self.claim, self.claimer, self.detached

    def cleared(self) -> "Hold":
        """As it is once a dead node's hold was removed."""
        if self.held is not None:
            return replace(self, held=None, holder=None)
        return replace(self, claim=None, claimer=None)


NO_HOLD = Hold()


class _Cql:
    """The node cache's statements, formatted once per keyspace."""

    def __init__(self, ks: str) -> None:
        t = f"{ks}.node_volatile"
        pk = "db = ? AND bucket = ? AND k = ?"
        self.take = (f'UPDATE {t} SET holder = ?, held = ?, ver = ? WHERE {pk} IF "token" = null AND held = null '
                     "AND holder = ? AND claim = ? AND claimer = ? AND detached = ? AND v = ?")
        self.partition = (f'SELECT k, v, "token", held, detached, claim, claimer, ver FROM {t} '
                          "WHERE db = ? AND bucket = ?")
        self.claim = (f"UPDATE {t} SET claim = ?, claimer = ?, ver = ? WHERE db = ? AND bucket = ? "
                      "IF claim = ? AND ver = ?")
        self.undetach = f"UPDATE {t} SET detached = null WHERE {pk}"
        self.claim_of = f"SELECT claim, ver FROM {t} WHERE db = ? AND bucket = ? LIMIT 1"
        self.back_lock = f"UPDATE {t} SET v = ?, holder = null, held = null WHERE {pk} IF held = ?"
        self.back_bucket = f"UPDATE {t} SET v = ?, detached = ? WHERE {pk} IF claim = ? AND detached = null"
        self.through_lock = f"UPDATE {t} SET v = ? WHERE {pk} IF held = ?"
        self.through_bucket = f"UPDATE {t} SET v = ? WHERE {pk} IF claim = ? AND detached = null"
        # as the adapter's own (cassandra.py): the writer's receipt, in the same conditional batch
        self.receipt = f"UPDATE {t} USING TTL {cc.RECEIPT_TTL} SET receipts[?] = ? WHERE {pk}"
        self.serial = f"SELECT v, receipts, held, claim FROM {t} WHERE {pk}"
        self.row = f"SELECT held, holder, claim, claimer, detached FROM {t} WHERE {pk}"
        self.unlock = f"UPDATE {t} SET holder = null, held = null WHERE {pk} IF held = ?"
        self.unclaim = f"UPDATE {t} SET claim = null, claimer = null WHERE db = ? AND bucket = ? IF claim = ?"
        self.release = (f"UPDATE {t} SET claim = null, claimer = null, ver = ? WHERE db = ? AND bucket = ? "
                        "IF claim = ?")
        self.put = f"UPDATE {t} SET v = ? WHERE {pk}"
        self.ask = f"INSERT INTO {ks}.requests (node, db, k, asked) VALUES (?, ?, ?, ?) USING TTL ?"
        self.served = f"DELETE FROM {ks}.requests WHERE node = ? AND db = ? AND k = ?"
        # a traverse's request (nodecache/sync.py): conditional, so a keep-alive never revives a served one
        self.answered = f"DELETE FROM {ks}.requests WHERE node = ? AND db = ? AND k = ? IF EXISTS"
        request = "node = ? AND db = ? AND k = ?"
        self.waiting = f"SELECT asked, TTL(asked) AS remaining FROM {ks}.requests WHERE {request}"
        self.keep = f"UPDATE {ks}.requests USING TTL ? SET asked = ? WHERE {request} IF asked = ?"
        self.holders = f"SELECT held, holder, claim, claimer FROM {t} WHERE db = ? AND bucket IN ?"
        self.leases = f"SELECT name, lease FROM {ks}.nodes"
        self.lease = f"SELECT lease FROM {ks}.nodes WHERE name = ?"
        self.generation = f"SELECT generation FROM {ks}.databases WHERE db = ?"


class CassandraOwnership(Ownership):
    """One database's ownership operations on ``client`` (a process's, or the
    agent's). ``generation``: the one the process opened; None for the
    agent, which reads it where no token says it."""

    def __init__(self, client: cc.Client, name: str, generation: int | None, op_timeout: float) -> None:
        self.client = client
        self.name = name
        self.generation = generation
        self.op_timeout = op_timeout
        self.cql = _Cql(client.config.keyspace)
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

    def live(self, node: bytes, lease: int) -> bool:
        """Is ``lease`` the node's live lease, as Cassandra says (its TTL)?"""
        rows = self.client.run("node lease", self.cql.lease, (node.decode(),))
        return bool(rows) and rows[0].lease == lease

    def settle(self, key: bytes, hold: Hold) -> bytes | None:
        """The live node behind ``hold``; a dead lease's entry is removed
        (guarded on its token) and None returned, so the caller tries again."""
        node, lease = hold.node()
        if self.live(node, lease):
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
        for _ in attempts(self.op_timeout, f"take {key!r}: its row"):
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
            if row is not None:
                if row.token is not None:
                    raise OwnedElsewhere(None, f"{key!r} is locked by a process")
                hold, guess = Hold.of(row), row.v
                if hold.holds():
                    if hold.node() == (node, lease):  # ours: a taker of ours died before keeping it, or our bucket
                        return Taken(row.v, hold.token(), via_bucket=hold.by_claim())
                    owner = self.settle(key, hold)
                    if owner is not None:
                        self._seen[key] = guess
                        raise OwnedElsewhere(owner, f"{key!r} is held by node {owner.decode()}")
                    hold = hold.cleared()
            # else free (a dead hold removed, a wrong guess, or detached): again, guarded on what was read

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        generation = self._current()
        where = self._partition(bucket, generation)
        rows = self.client.run("claim", self.cql.partition, where, serial=True)
        claim = rows[0].claim if rows else None
        ver = rows[0].ver if rows else None
        if claim is not None and self.live(*parse_holder(rows[0].claimer)):
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

    def request_release(self, key: bytes, owner: bytes, requester_lease: int) -> None:
        # the requester's lease is not at hand here: the request lives op_timeout, and a
        # waiter asks again while it waits
        self.client.run("release request", self.cql.ask,
                        (owner.decode(), self.name, cc.stored_key(key), secrets.randbits(63),
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
        if rows[0].remaining is not None and rows[0].remaining * 2 <= ttl and self._leases_live({requester_lease}):
            try:
                self.client.lwt("release request kept", self.cql.keep, (ttl, rows[0].asked, *where, rows[0].asked))
            except cc.OutcomeUnknown:
                pass  # looked at again on the next poll
        return True

    def _leases_live(self, leases: set[int]) -> set[tuple[bytes, int]]:
        """Which of ``leases`` are live, with their nodes (``nodes``: one row a node)."""
        return {(row.name.encode(), row.lease) for row in self.client.run("node leases", self.cql.leases)
                if row.lease in leases}

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

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        if via_bucket:  # the key leaves the claim: detached, marked with the claim's token
            done = self._fenced("write back", key, token, self.cql.back_bucket, value, (token,))
        else:
            done = self._fenced("write back", key, token, self.cql.back_lock, value)
        self.served(node, key)
        return done

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        cql = self.cql.through_bucket if via_bucket else self.cql.through_lock
        return self._fenced("write through", key, token, cql, value)

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        pk = self._pk(key, self._current())
        rows = self.client.run("let go", self.cql.row, pk)
        if rows and rows[0].held is not None and parse_holder(rows[0].holder) == (node, lease):
            try:
                self.client.lwt("let go", self.cql.unlock, (*pk, rows[0].held))
            except cc.OutcomeUnknown:
                pass  # a lock of a lease that ends is settled by whoever needs the record
        self.served(node, key)

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
        if hold.holds() and self.live(*hold.node()):
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
        if not holders:
            return frozenset()
        live = self._leases_live({lease for _, lease in holders})
        return frozenset(node for node, lease in holders & live)


class CassandraNodeStore(NodeStore):
    """The node agent's side: its lease in ``nodes``, its requests polled from ``requests``."""

    def __init__(self, config: cc.ClientConfig, poll: float = REQUEST_POLL) -> None:
        self.client = cc.Client(config)
        self.config = config
        self.poll = poll
        self.op_timeout = config.op_timeout
        self.cql = _Cql(config.keyspace)
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
        try:
            self.client.lwt("revoke", f"DELETE FROM {self.config.keyspace}.nodes WHERE name = ? IF lease = ?",
                            (self._node.decode(), lease.id))
        except cc.OutcomeUnknown:
            pass  # it expires by itself

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes]]:
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
