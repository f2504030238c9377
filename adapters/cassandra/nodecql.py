"""The cassandra adapter's node-cache columns and statements (``ownership.py``, ``adapter.py``).

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

"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.nodecache.ownership_base import Held, holder_mark, parse_holder_mark


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

    def held_by(self) -> Held | None:
        """The node's hold, for ``ownership_base.take_retrying``; None if nobody holds it."""
        return Held(*self.node(), self.token(), self.by_claim()) if self.holds() else None

    def guesses(self) -> tuple[Any, ...]:
        """For ``held = null AND holder = ? AND claim = ? AND claimer = ? AND detached = ?``."""
        return self.holder, self.claim, self.claimer, self.detached

    def cleared(self) -> "Hold":
        """As it is once a dead node's hold was removed."""
        if self.held is not None:
            return replace(self, held=None, holder=None)
        return replace(self, claim=None, claimer=None)


NO_HOLD = Hold()


class NodeCql:
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
        # a hand-over: the write-back with the asking node's lock, as its take would set it
        self.hand_lock = f"UPDATE {t} SET v = ?, holder = ?, held = ?, ver = ? WHERE {pk} IF held = ?"
        self.hand_bucket = (f"UPDATE {t} SET v = ?, detached = ?, holder = ?, held = ?, ver = ? WHERE {pk} "
                            "IF claim = ? AND detached = null")
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
        request = "node = ? AND db = ? AND k = ?"
        self.ask = f"INSERT INTO {ks}.requests (node, db, k, asked, requester) VALUES (?, ?, ?, ?, ?) USING TTL ?"
        self.served = f"DELETE FROM {ks}.requests WHERE {request}"
        self.asked = f"SELECT requester FROM {ks}.requests WHERE {request}"  # whom a hand-over gives the record
        # a traverse's request (nodecache/sync.py): conditional, so a keep-alive never revives a served one
        self.answered = f"DELETE FROM {ks}.requests WHERE {request} IF EXISTS"
        self.waiting = f"SELECT asked, TTL(asked) AS remaining FROM {ks}.requests WHERE {request}"
        self.keep = f"UPDATE {ks}.requests USING TTL ? SET asked = ? WHERE {request} IF asked = ?"
        self.holders = f"SELECT held, holder, claim, claimer FROM {t} WHERE db = ? AND bucket IN ?"
        self.leases = f"SELECT name, lease FROM {ks}.nodes"
        self.lease = f"SELECT lease FROM {ks}.nodes WHERE name = ?"
        self.generation = f"SELECT generation FROM {ks}.databases WHERE db = ?"


class Leases:
    """Which node leases are live, as Cassandra says (the TTLs of ``nodes``: one row a node)."""

    def __init__(self, client: cc.Client, cql: NodeCql) -> None:
        self.client = client
        self.cql = cql

    def live(self, node: bytes, lease: int) -> bool:
        rows = self.client.run("node lease", self.cql.lease, (node.decode(),))
        return bool(rows) and rows[0].lease == lease

    def of(self, leases: set[int]) -> set[tuple[bytes, int]]:
        """Which of ``leases`` are live, with their nodes."""
        return {(row.name.encode(), row.lease) for row in self.client.run("node leases", self.cql.leases)
                if row.lease in leases}
