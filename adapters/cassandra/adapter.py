"""cassandra: Samba's databases in Apache Cassandra tables, record locks as
lightweight transactions (LWT) with fencing.

Tables (a volatile database's records a partition each, a persistent one's
one partition, its transaction one conditional batch) and CQL: ``schema.py``.
Record locks (dbwrap_py.leased builds lock, put, unlock on them): the cells
``owner`` and ``"token"`` of the record's own row, with a TTL; a take guesses
the value (the lock and the read in one LWT), every locked write is
conditional on the lock and leaves a receipt, and an unknown outcome is
resolved by a read at SERIAL (``schema.Statements`` tells how).

TDB_CLEAR_IF_FIRST: the openers service (``dbwrap_py.openers``) on this
store's primitives (``openers.py``): the first opener starts a new
generation of the database instead of deleting it record by record.
Node cache (``node_cache = yes``, volatile databases): ``ownership.py``
is this adapter's side of the protocol. It needs layout ``buckets``
(``schema.py``); the record lock statements above are the same there, with
(db, bucket, k) as the key, and a take is also refused while a live node
owns the record (that node is asked to hand it over). Client plumbing
(sessions per process, errors, unknown outcomes): ``client.py``.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections import OrderedDict
from typing import Any

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, TDB_SEQNUM, Capabilities, DatabaseSpec
from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.adapters.cassandra import nodestore
from dbwrap_py.adapters.cassandra import ownership as owning
from dbwrap_py.adapters.cassandra import schema
from dbwrap_py.adapters.cassandra.openers import CassandraOpeners
from dbwrap_py.errors import AdapterContractError, ConfigError
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, Keep, LeaseSource
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.openers import OPENERS, Registration
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import retry_until
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_LEASE = 10.0
#: values remembered per open database as take's guess (the most recently used)
SEEN_KEYS = 4096
#: a record's value: Cassandra refuses mutations above half a commitlog segment (16 MiB by default)
MAX_VALUE_SIZE = 4 * 1024 * 1024


class CassandraAdapter(TransactionalLeasedAdapter):
    capabilities = Capabilities(
        transactions=True, lock_release_seconds=DEFAULT_LEASE, max_value_size=MAX_VALUE_SIZE,
        notes=("a persistent database is one partition: its transaction commits as one conditional batch",
               "in a persistent database a record lock waits for another process's transaction; "
               "a transaction does not wait for record locks taken before it started",
               "a traverse of a volatile database reads its rows through a secondary index on db"))
    options_schema = (*LEASE_OPTIONS, *cc.CLIENT_OPTIONS,
                      Option("layout", str, None, help="records or buckets (default: buckets with the node cache)"),
                      Option("request_poll", float, owning.REQUEST_POLL, minimum=0.001,
                             help="seconds between the node agent's polls for ownership requests"))
    default_lease = DEFAULT_LEASE
    lease_source = LeaseSource.SERVER_TTL
    #: Cassandra purges an expired cell when it is read: no lag beyond the second
    lease_slack = 0.0
    #: the dialect unless the ``dialect`` option says otherwise (scylla.py: scylla)
    dialect = "cassandra"

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self.config = cc.ClientConfig.from_options(options, self.op_timeout, self.dialect)
        self.client = cc.Client(self.config)
        schema.ensure(self.config)
        self.name = spec.cluster_name
        #: ScyllaDB returns the old row from every conditional statement, applied or not
        self.old_row = cc.session_for(self.config).scylla_server
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        # the value last seen per key, take's guess; bounded, since a smbd
        # process lives long and locking.tdb's keys are every file it touched
        self._seen: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._bump_seqnum = not spec.persistent and bool(spec.tdb_flags & TDB_SEQNUM)
        self._txn_seq = 0  # the partition's seq when the transaction lock was taken
        self._registration: Registration | None = None  # this opener's, in dbwrap_py.openers
        self.generation = 0
        self.db = self.name  # the partition key's db: with the generation for a volatile database
        self.node_cache_id = self.name.encode()
        #: records (a partition per record) or buckets (the node cache's: a partition per bucket);
        #: a volatile database's first opener of a generation chooses, later ones follow
        self.layout = schema.layout_asked(options)
        if not spec.persistent:
            self._open_volatile()
        self.buckets = not spec.persistent and self.layout == schema.BUCKETS
        self.cql = schema.Statements(self.config.keyspace, schema.table_of(spec.persistent, self.layout),
                                     spec.persistent, self.old_row, self.buckets)

    @property
    def round_trips(self) -> int:
        return self.client.round_trips

    # -- the lease primitives (dbwrap_py.leased) -------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        guess = self._seen.get(key)
        nodes = owning.NO_HOLD  # the node cache's guesses (layout buckets): nobody holds it
        for _ in range(3):  # a wrong guess costs one more try
            ver = (secrets.randbits(63),) if self.buckets else ()
            args = (int(seconds), self.owner, token, *ver, *self._pk(key),
                    *(nodes.guesses() if self.buckets else ()), *(() if self.old_row else (guess,)))
            try:
                applied, row = self.client.lwt("lock", self.cql.take, args)
            except cc.OutcomeUnknown:
                value, holder, _ = self._read_serial(key)
                return (True, value) if holder == token else (False, None)
            if applied and self.old_row:  # never run here: no ScyllaDB server (adapters/cassandra/scylla.py)
                if "v" not in row._fields:
                    raise AdapterContractError("dialect scylla: the server's LWT result has no old row")
                return True, row.v
            if applied:
                return True, guess
            if row.token is not None:
                return False, None
            if self.buckets:
                nodes = owning.Hold.of(row)
                if nodes.holds():
                    ownership = self.ownership()
                    owner = ownership.settle(key, nodes)
                    if owner is not None:  # a live node: ask it, and wait as for a lock
                        ownership.request_release(key, owner, 0)
                        return False, None
                    nodes = nodes.cleared()  # a dead node's hold, removed
            guess = row.v
            self._remember(key, guess)
        return False, None  # it changed between the tries: the caller tries again

    def renew_lease(self, key: bytes, token: int, seconds: float) -> bool:
        args = (int(seconds), self.owner, token, *self._pk(key), self.owner, token)
        # unknown: the next renewal finds out; a lost lease still fences our writes
        return self.client.applied("lock renewal", self.cql.renew, args, unknown=lambda: True)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        return self._locked_write(key, token, value, self.cql.write, "store")

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        if value is KEEP:  # released or not: a lock of ours left behind ends with its TTL
            self.client.applied("unlock", self.cql.end, (*self._pk(key), self.owner, token), unknown=lambda: True)
            return True
        return self._locked_write(key, token, value, self.cql.write_end, "store and unlock")

    def _locked_write(self, key: bytes, token: int, value: bytes | None, cql: str, what: str) -> bool:
        write_id, applied = secrets.randbits(63), False
        for _ in retry_until(time.monotonic() + self.op_timeout, cc.CONTENDED):
            try:
                applied, _ = self.client.batch(what, [
                    (cql, (value, *self._pk(key), self.owner, token)),
                    (self.cql.receipt, (self.owner, write_id, *self._pk(key)))])
                break
            except cc.OutcomeUnknown:
                _, holder, receipt = self._read_serial(key)
                applied = receipt == write_id
                # not applied while the lock is still ours: Paxos lost to
                # contention, not to another holder; send it again
                if applied or holder != token:
                    break
        if applied:
            self._remember(key, value)
            if self._bump_seqnum:  # after the write: a reader seeing the new number sees the write
                self.client.run("seqnum", self.cql.bump_seqnum, (self.name,), idempotent=False)
        return applied

    def _remember(self, key: bytes, value: bytes | None) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        if len(self._seen) > SEEN_KEYS:
            self._seen.popitem(last=False)

    def _read_serial(self, key: bytes) -> tuple[bytes | None, int | None, int | None]:
        """The record, its lock token and this process's last receipt for it,
        at SERIAL: any Paxos round in flight on it is finished first."""
        rows = self.client.run("resolve", self.cql.serial, self._pk(key), serial=True)
        if not rows:
            return None, None, None
        return rows[0].v, rows[0].token, (rows[0].receipts or {}).get(self.owner)

    # -- the rest ---------------------------------------------------------------------

    def read_record(self, key: bytes) -> bytes | None:
        rows = self.client.run("fetch", self.cql.get, self._pk(key))
        if self.buckets and rows and owning.Hold.of(rows[0], read=True).holds():
            return self.read_from_its_node(key)
        value = rows[0].v if rows else None
        self._remember(key, value)
        return value

    def _pk(self, key: bytes) -> tuple[Any, ...]:
        """The record's primary key: its partition is the record, or its bucket (layout buckets)."""
        return (self.db, bucket_of(key), cc.stored_key(key)) if self.buckets else (self.db, cc.stored_key(key))

    def scan_records(self) -> list[tuple[bytes, bytes]]:
        rows = self.client.pages("traverse", self.cql.scan, (self.db,))
        return [(r.k[1:], r.v) for r in rows if r.k is not None and r.v is not None]

    def seqnum(self) -> int:
        rows = self.client.run("seqnum", self.cql.seqnum, (self.db if self.spec.persistent else self.name,))
        return (rows[0][0] or 0) if rows else 0

    # -- transactions (persistent databases: one partition) ----------------------------

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        taken = self.client.applied("transaction lock", self.cql.txn_take, (int(seconds), token, self.owner, self.db),
                                    unknown=lambda: self._transaction_row()[0] == token)
        if taken:
            self._txn_seq = self._transaction_row()[2]
        return taken

    def renew_transaction_lock(self, token: int, seconds: float) -> bool:
        return self.client.applied("transaction lock renewal", self.cql.txn_renew,
                                   (int(seconds), token, self.owner, self.db, token),
                                   unknown=lambda: self._transaction_row()[0] == token)

    def _transaction_row(self) -> tuple[int | None, int | None, int]:
        """The partition's transaction lock, this process's last commit id and seq, at SERIAL."""
        rows = self.client.run("transaction", self.cql.txn_row, (self.db,), serial=True)
        if not rows:
            return None, None, 0
        return rows[0].txn, (rows[0].commits or {}).get(self.owner), rows[0].seq or 0

    def commit_transaction(self, token: int, writes: Writes) -> bool:
        commit_id = secrets.randbits(63)
        statements: list[tuple[str, Any]] = [
            (self.cql.txn_write, (v, self.db, cc.stored_key(k))) for k, v in writes.items()]
        statements.append((self.cql.txn_commit, (self._txn_seq + 1, self.db, token)))
        # the commit's receipt: the next transaction writes its own, not over ours
        statements.append((self.cql.txn_receipt, (self.owner, commit_id, self.db)))
        try:
            applied, _ = self.client.batch("commit", statements)
        except cc.OutcomeUnknown:
            applied = self._transaction_row()[1] == commit_id
        if applied:
            for key, value in writes.items():
                self._remember(key, value)
        return bool(applied)

    def release_transaction_lock(self, token: int) -> None:
        # unknown: a lock left behind ends with its TTL
        self.client.applied("cancel", self.cql.txn_cancel, (self.db, token), unknown=lambda: True)

    # -- opening a volatile database (dbwrap_py.openers; the store's side: openers.py) ---

    def _open_volatile(self) -> None:
        """Join the openers; the first one (TDB_CLEAR_IF_FIRST) starts a new generation."""
        store = CassandraOpeners(self.client, self.name, self.layout, self._bump_seqnum)
        self._registration = OPENERS.open(store, bool(self.spec.tdb_flags & TDB_CLEAR_IF_FIRST))
        self.generation, self.layout = store.generation, store.layout
        self.db = f"{self.name}:{self.generation}"

    # -- lifetime ---------------------------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()
        self.owner = f"{socket.gethostname()}:{os.getpid()}"  # whose receipts are whose

    def close(self) -> None:
        if self._registration is not None:  # a parent's, in a child: dbwrap_py.openers leaves it alone
            OPENERS.leave(self._registration)
            self._registration = None

    # -- the node cache (dbwrap_py.nodecache.protocol) ----------------------------------------

    @classmethod
    def node_store(cls, options: Options) -> nodestore.CassandraNodeStore:
        """The node agent's side (``dbwrap-py node-agent --adapter cassandra``)."""
        options = cls.options_of(options)
        op_timeout = options.value("op_timeout")
        config = cc.ClientConfig.from_options(options, op_timeout, cls.dialect)
        schema.ensure(config)  # the agent may come before any database
        return nodestore.CassandraNodeStore(config, options.value("request_poll"))

    def ownership(self) -> owning.CassandraOwnership:
        """This database's ownership operations, on this database's client."""
        if not self.buckets:
            raise ConfigError(f"{self.name}: node_cache needs layout = {schema.BUCKETS}, and this generation's "
                              f"first opener chose {self.layout}: open it with node_cache (or layout = "
                              f"{schema.BUCKETS}) everywhere")
        return owning.CassandraOwnership(self.client, self.name, self.generation, self.op_timeout)

    @property
    def wipe_revision(self) -> int:
        """The node cache voids ownership tokens up to it."""
        return owning.wipe_revision(self.generation)


ADAPTER = CassandraAdapter
