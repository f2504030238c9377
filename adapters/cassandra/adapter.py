"""cassandra: Samba's databases in Apache Cassandra tables, record locks as
lightweight transactions (LWT) with fencing.

Tables, in keyspace ``keyspace`` (default ``dbwrap_py``; ``<db>`` is
``DatabaseSpec.cluster_name``):

* ``volatile``: PRIMARY KEY ((db, k)), each record its own partition. Paxos
  runs per partition, so LWTs on different records never contend; a
  database of one partition would put every record lock of locking.tdb in
  one Paxos queue. A secondary index on ``db`` finds a database's records
  for a traverse. ``db`` is ``<db>:<generation>``: a CLEAR_IF_FIRST wipe
  starts a new generation (one LWT) instead of deleting record by record.
* ``persistent``: PRIMARY KEY (db, k), one partition per database, with
  static columns ``txn`` (the transaction lock), ``seq`` and ``commits``.
  A transaction commits as one conditional single-partition batch: Cassandra
  applies it as one Paxos proposal, all or nothing and isolated, and only
  while ``txn`` is still ours. A client that dies mid-commit either sent the
  batch (it is applied, by the coordinator or by the next Paxos round on the
  partition) or did not (nothing is).
* ``databases`` (a volatile database's generation and its open lock),
  ``openers`` (who has it open, rows with a TTL renewed by each opener),
  ``seqnums`` (a counter per volatile database opened with TDB_SEQNUM).

Record locks (dbwrap_py.leased builds lock, put, unlock on these): the cells
``owner`` and ``"token"`` of the record's own row, written with ``USING TTL
<lease>``, so the server drops a dead holder's lock, not a client clock.

* take: ``UPDATE ... USING TTL SET owner, "token" IF "token" = null AND v =
  <guess>``: applied, it is the lock and the read in one round trip; the
  guess is the value this process last saw (null for a new record). Not
  applied with the token null, the row it returns holds the value: a second
  try with that guess takes the lock.
* every locked write: ``UPDATE ... IF owner = ? AND "token" = ?``, so a
  holder whose TTL ran out writes nothing (FencedOut); write+unlock is one
  such statement. In the same conditional batch each leaves a receipt: the
  write's random id in ``receipts[<writer>]``, a cell of the record's row
  with a TTL of its own (cc.RECEIPT_TTL). The writer is this process, which
  holds the lock while it writes: the next holder writes a receipt of its
  own, not over ours.
* an unknown outcome (``client.py``) is resolved by reading the row
  at SERIAL: the token says whether a take was applied, the receipt whether
  a write was, even once the next holder has written the record since.

TDB_CLEAR_IF_FIRST: the opener takes the ``opening`` LWT lock of the
database's row, looks for live rows in ``openers``, starts a new generation
if there are none, adds its own row (TTL ``OPENER_TTL``, renewed by a thread
of the opening process) and lets the lock go. A killed opener counts as open
until its row expires.

Node cache (``node_cache = yes``, volatile databases): ``ownership.py``
is this adapter's side of the protocol. It needs layout ``buckets``
(``node_volatile``: a partition per bucket, so that a record's process lock,
a node's lock on it and its bucket's claim are decided by one LWT); the
record lock statements above are the same there, with (db, bucket, k) as
the key, and a take is also refused while a live node owns the record (that
node is asked to hand it over). A generation's first opener chooses the
layout (option ``layout``, by default ``buckets`` with node_cache, else
``records``), kept in ``databases.layout``; later openers follow it.

Client plumbing (sessions per process, errors, unknown outcomes): ``client.py``.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, TDB_SEQNUM, Capabilities, DatabaseSpec
from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.adapters.cassandra import nodestore
from dbwrap_py.adapters.cassandra import ownership as owning
from dbwrap_py.errors import AdapterContractError, ConfigError, Timeout
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, Keep, LeaseSource
from dbwrap_py.nodecache.adapter import node_cache_mode
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import Backoff, retry_until
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_LEASE = 10.0
#: a volatile database's layouts: a partition per record, or per bucket (the node cache's)
RECORDS, BUCKETS = "records", "buckets"
#: seconds an opener's row lives unless renewed (renewed every third of it)
OPENER_TTL = 10
#: values remembered per open database as take's guess (the most recently used)
SEEN_KEYS = 4096
#: a record's value: Cassandra refuses mutations above half a commitlog segment (16 MiB by default)
MAX_VALUE_SIZE = 4 * 1024 * 1024
#: between two tries of an LWT that lost its Paxos round to contention: clients
#: retrying in step keep one Paxos instance contended, the holder's release
#: included (measured: 8 openers on 3 nodes timed out at a fixed 20 ms)
CONTENDED = Backoff(first=0.01, cap=0.25)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.volatile (db text, k blob, v blob, owner text, "token" bigint,
       receipts map<text, bigint>, PRIMARY KEY ((db, k)))""",
    # a traverse reads the database's rows by this index, not the whole table
    "CREATE INDEX IF NOT EXISTS volatile_db ON {ks}.volatile (db)",
    """CREATE TABLE IF NOT EXISTS {ks}.persistent (db text, k blob, v blob, owner text, "token" bigint,
       receipts map<text, bigint>, txn bigint static, txn_owner text static, seq bigint static,
       commits map<text, bigint> static,
       PRIMARY KEY (db, k))""",
    "CREATE TABLE IF NOT EXISTS {ks}.databases (db text PRIMARY KEY, generation bigint, opening bigint, layout text)",
    # the node cache's layout (ownership.py): a bucket's records in one
    # partition, its claim in static columns, so one LWT decides about a record
    """CREATE TABLE IF NOT EXISTS {ks}.node_volatile (db text, bucket int, k blob, v blob, owner text,
       "token" bigint, receipts map<text, bigint>, holder text, held bigint, detached bigint,
       claim bigint static,
       claimer text static, ver bigint static, PRIMARY KEY ((db, bucket), k))""",
    "CREATE INDEX IF NOT EXISTS node_volatile_db ON {ks}.node_volatile (db)",
    "CREATE TABLE IF NOT EXISTS {ks}.nodes (name text PRIMARY KEY, lease bigint)",
    # polled by the owner's agent; deleted once served, so short-lived tombstones
    """CREATE TABLE IF NOT EXISTS {ks}.requests (node text, db text, k blob, asked bigint,
       PRIMARY KEY (node, db, k)) WITH gc_grace_seconds = 60""",
    "CREATE TABLE IF NOT EXISTS {ks}.openers (db text, opener bigint, PRIMARY KEY (db, opener))",
    "CREATE TABLE IF NOT EXISTS {ks}.seqnums (db text PRIMARY KEY, n counter)",
)
_SCHEMA_DONE: set[cc.ClientConfig] = set()
#: a ``databases`` row that is not there yet
_NO_ROW = type("NoRow", (), {"opening": None, "generation": None, "layout": None})()



class _Statements:
    """The CQL of one table, formatted once. ``buckets``: the node cache's
    layout (table node_volatile, partition (db, bucket)): a take also sets
    ``ver`` (a claim is guarded on it) and is refused while a node holds the
    record (``held``) or its bucket (``claim``, unless the key was detached
    from that very claim): guessed values, as ``v``."""

    def __init__(self, ks: str, table: str, persistent: bool, old_row: bool, buckets: bool = False) -> None:
        t = f"{ks}.{table}"
        where = "db = ? AND bucket = ? AND k = ?" if buckets else "db = ? AND k = ?"
        free = "txn = null AND " if persistent else ""
        # a server that returns the old row (ScyllaDB) needs no guess of the value
        guess = "" if old_row else " AND v = ?"
        nodes = (" AND held = null AND holder = ? AND claim = ? AND claimer = ? AND detached = ?"
                 if buckets else "")
        ver = ", ver = ?" if buckets else ""
        self.take = (f'UPDATE {t} USING TTL ? SET owner = ?, "token" = ?{ver} WHERE {where} '
                     f'IF {free}"token" = null{nodes}{guess}')
        self.renew = (f'UPDATE {t} USING TTL ? SET owner = ?, "token" = ? WHERE {where} '
                      f'IF owner = ? AND "token" = ?')
        self.write = f'UPDATE {t} SET v = ? WHERE {where} IF owner = ? AND "token" = ?'
        self.write_end = (f'UPDATE {t} SET v = ?, owner = null, "token" = null WHERE {where} '
                          f'IF owner = ? AND "token" = ?')
        self.receipt = f"UPDATE {t} USING TTL {cc.RECEIPT_TTL} SET receipts[?] = ? WHERE {where}"
        self.end = f'UPDATE {t} SET owner = null, "token" = null WHERE {where} IF owner = ? AND "token" = ?'
        self.get = (f"SELECT v, held, claim, detached FROM {t} WHERE {where}" if buckets
                    else f"SELECT v FROM {t} WHERE {where}")
        self.serial = f'SELECT v, "token", receipts FROM {t} WHERE {where}'
        self.scan = f"SELECT k, v FROM {t} WHERE db = ?"  # a partition, or by the index on db


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
        cc.ensure_schema(self.config, SCHEMA, _SCHEMA_DONE)
        ks = self.config.keyspace
        self.name = spec.cluster_name
        #: ScyllaDB returns the old row from every conditional statement, applied or not
        self.old_row = cc.session_for(self.config).scylla_server
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        # the value last seen per key, take's guess; bounded, since a smbd
        # process lives long and locking.tdb's keys are every file it touched
        self._seen: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._bump_seqnum = not spec.persistent and bool(spec.tdb_flags & TDB_SEQNUM)
        self._txn_seq = 0  # the partition's seq when the transaction lock was taken
        self._opener = 0
        self.generation = 0
        self.db = self.name  # the partition key's db: with the generation for a volatile database
        self.node_cache_id = self.name.encode()
        #: records (a partition per record) or buckets (the node cache's: a partition per bucket);
        #: a volatile database's first opener of a generation chooses, later ones follow
        layout = options.value("layout")
        self.layout = (BUCKETS if node_cache_mode(options) else RECORDS) if layout is None else layout
        if self.layout not in (RECORDS, BUCKETS):
            raise ConfigError(f"layout = {self.layout!r}: {RECORDS} or {BUCKETS}")
        if not spec.persistent:
            self._open_volatile()
        self.buckets = not spec.persistent and self.layout == BUCKETS
        table = "persistent" if spec.persistent else "node_volatile" if self.buckets else "volatile"
        self.cql = _Statements(ks, table, spec.persistent, self.old_row, self.buckets)

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
        try:
            applied, _ = self.client.lwt("lock renewal", self.cql.renew, args)
        except cc.OutcomeUnknown:
            return True  # the next renewal finds out; a lost lease still fences our writes
        return bool(applied)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        return self._locked_write(key, token, value, self.cql.write, "store")

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        if value is KEEP:
            try:
                self.client.lwt("unlock", self.cql.end, (*self._pk(key), self.owner, token))
            except cc.OutcomeUnknown:
                pass  # released or not: a lock of ours left behind ends with its TTL
            return True
        return self._locked_write(key, token, value, self.cql.write_end, "store and unlock")

    def _locked_write(self, key: bytes, token: int, value: bytes | None, cql: str, what: str) -> bool:
        write_id, applied = secrets.randbits(63), False
        for _ in retry_until(time.monotonic() + self.op_timeout, CONTENDED):
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
                self.client.run("seqnum", f"UPDATE {self.config.keyspace}.seqnums SET n = n + 1 WHERE db = ?",
                                (self.name,), idempotent=False)
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
        ks = self.config.keyspace
        if self.spec.persistent:
            rows = self.client.run("seqnum", f"SELECT seq FROM {ks}.persistent WHERE db = ? LIMIT 1", (self.db,))
        else:
            rows = self.client.run("seqnum", f"SELECT n FROM {ks}.seqnums WHERE db = ?", (self.name,))
        return (rows[0][0] or 0) if rows else 0

    # -- transactions (persistent databases: one partition) ----------------------------

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        cql = (f"UPDATE {self.config.keyspace}.persistent USING TTL ? SET txn = ?, txn_owner = ? "
               "WHERE db = ? IF txn = null")
        try:
            taken, _ = self.client.lwt("transaction lock", cql, (int(seconds), token, self.owner, self.db))
        except cc.OutcomeUnknown:
            taken = self._transaction_row()[0] == token
        if taken:
            self._txn_seq = self._transaction_row()[2]
        return bool(taken)

    def _transaction_row(self) -> tuple[int | None, int | None, int]:
        """The partition's transaction lock, this process's last commit id and seq, at SERIAL."""
        rows = self.client.run("transaction", f"SELECT txn, commits, seq FROM {self.config.keyspace}.persistent"
                               " WHERE db = ? LIMIT 1", (self.db,), serial=True)
        if not rows:
            return None, None, 0
        return rows[0].txn, (rows[0].commits or {}).get(self.owner), rows[0].seq or 0

    def commit_transaction(self, token: int, writes: Writes) -> bool:
        t = f"{self.config.keyspace}.persistent"
        commit_id = secrets.randbits(63)
        statements: list[tuple[str, Any]] = [
            (f"UPDATE {t} SET v = ? WHERE db = ? AND k = ?", (v, self.db, cc.stored_key(k)))
            for k, v in writes.items()]
        statements.append((f"UPDATE {t} SET txn = null, txn_owner = null, seq = ? WHERE db = ? IF txn = ?",
                           (self._txn_seq + 1, self.db, token)))
        # the commit's receipt: the next transaction writes its own, not over ours
        statements.append((f"UPDATE {t} USING TTL {cc.RECEIPT_TTL} SET commits[?] = ? WHERE db = ?",
                           (self.owner, commit_id, self.db)))
        try:
            applied, _ = self.client.batch("commit", statements)
        except cc.OutcomeUnknown:
            applied = self._transaction_row()[1] == commit_id
        if applied:
            for key, value in writes.items():
                self._remember(key, value)
        return bool(applied)

    def release_transaction_lock(self, token: int) -> None:
        try:
            self.client.lwt("cancel", f"UPDATE {self.config.keyspace}.persistent SET txn = null, txn_owner = null "
                            "WHERE db = ? IF txn = ?", (self.db, token))
        except cc.OutcomeUnknown:
            pass  # a lock left behind ends with its TTL

    # -- opening a volatile database -----------------------------------------------------

    def _open_volatile(self) -> None:
        """Join the openers; the first one (TDB_CLEAR_IF_FIRST) starts a new generation."""
        ks = self.config.keyspace
        lock = secrets.randbits(63)
        deadline = time.monotonic() + self.op_timeout
        self._take_open_lock(lock, deadline)
        try:
            row = self._open_row()
            self.generation = row.generation or 0
            if self.spec.tdb_flags & TDB_CLEAR_IF_FIRST and not self.client.run(
                    "open", f"SELECT opener FROM {ks}.openers WHERE db = ? LIMIT 1", (self.name,)):
                self.generation += 1
                self._set_open_row("generation = ?, layout = ?", (self.generation, self.layout), lock,
                                   lambda found: found.generation == self.generation)
            elif row.layout is None:  # a database from before layouts, or opened without CLEAR_IF_FIRST
                self._set_open_row("layout = ?", (self.layout,), lock, lambda found: found.layout == self.layout)
            else:
                self.layout = row.layout  # the generation's first opener chose it
                if self._bump_seqnum:
                    self.client.run("open", f"UPDATE {ks}.seqnums SET n = n + 1 WHERE db = ?", (self.name,),
                                    idempotent=False)
            self._opener = secrets.randbits(63)
            _OPENERS.join(self.config, self.name, self._opener)
        finally:
            self._let_open_lock_go(lock, deadline)
        self.db = f"{self.name}:{self.generation}"

    def _take_open_lock(self, lock: int, deadline: float) -> None:
        """The ``opening`` LWT lock of the database's row, tried again until ``deadline``."""
        for _ in retry_until(deadline, CONTENDED):
            try:
                applied, _ = self.client.lwt("open", f"UPDATE {self.config.keyspace}.databases USING TTL ? "
                                             "SET opening = ? WHERE db = ? IF opening = null",
                                             (max(int(self.op_timeout), 1), lock, self.name))
            except cc.OutcomeUnknown:  # contended Paxos: read who holds it
                applied = self._open_row().opening == lock
            if applied:
                return
        raise Timeout(f"{self.name}: another opener held the open lock past op_timeout")

    def _open_row(self) -> Any:
        """The database's row at SERIAL: ``opening`` (the open lock), ``generation`` and ``layout``."""
        rows = self.client.run("open", f"SELECT opening, generation, layout FROM {self.config.keyspace}.databases "
                               "WHERE db = ?", (self.name,), serial=True)
        return rows[0] if rows else _NO_ROW

    def _set_open_row(self, assignments: str, args: tuple[Any, ...], lock: int, done: Any) -> None:
        """Change the database's row while the open lock is still ours."""
        try:
            applied, _ = self.client.lwt("open", f"UPDATE {self.config.keyspace}.databases SET {assignments} "
                                         "WHERE db = ? IF opening = ?", (*args, self.name, lock))
        except cc.OutcomeUnknown:
            applied = done(self._open_row())
        if not applied:
            raise Timeout(f"{self.name}: the open lock expired before the open was done (op_timeout)")

    def _let_open_lock_go(self, lock: int, deadline: float) -> None:
        """Until it is known gone: a release lost in contention would keep
        every other opener waiting for its TTL; past ``deadline``, left to its TTL."""
        for _ in retry_until(deadline, CONTENDED):
            try:
                self.client.lwt("open", f"UPDATE {self.config.keyspace}.databases SET opening = null "
                                "WHERE db = ? IF opening = ?", (self.name, lock))
                return
            except cc.OutcomeUnknown:
                if self._open_row().opening != lock:
                    return  # gone

    # -- lifetime ---------------------------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()
        self.owner = f"{socket.gethostname()}:{os.getpid()}"  # whose receipts are whose
        self._opener = 0  # the parent's row; the parent renews and removes it

    def close(self) -> None:
        if self._opener:
            _OPENERS.leave(self.config, self.name, self._opener)
            self._opener = 0

    # -- the node cache (dbwrap_py.nodecache.protocol) ----------------------------------------

    @classmethod
    def node_store(cls, options: Options) -> nodestore.CassandraNodeStore:
        """The node agent's side (``dbwrap-py node-agent --adapter cassandra``)."""
        options = cls.options_of(options)
        op_timeout = options.value("op_timeout")
        config = cc.ClientConfig.from_options(options, op_timeout, cls.dialect)
        cc.ensure_schema(config, SCHEMA, _SCHEMA_DONE)  # the agent may come before any database
        return nodestore.CassandraNodeStore(config, options.value("request_poll"))

    def ownership(self) -> owning.CassandraOwnership:
        """This database's ownership operations, on this database's client."""
        if not self.buckets:
            raise ConfigError(f"{self.name}: node_cache needs layout = {BUCKETS}, and this generation's "
                              f"first opener chose {self.layout}: open it with node_cache (or layout = "
                              f"{BUCKETS}) everywhere")
        return owning.CassandraOwnership(self.client, self.name, self.generation, self.op_timeout)

    @property
    def wipe_revision(self) -> int:
        """The node cache voids ownership tokens up to it."""
        return owning.wipe_revision(self.generation)


class _Openers:
    """This process's opener rows, renewed by one thread while the process
    lives; a forked child's thread is not there, and its parent renews."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, int], cc.ClientConfig] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def join(self, config: cc.ClientConfig, db: str, opener: int) -> None:
        self._renew_one(config, db, opener)
        with self._lock:
            self._rows[(db, opener)] = config
            if self._pid != os.getpid():
                self._rows = {(db, opener): config}  # the parent's rows are the parent's to renew
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._renew, name="dbwrap-py openers", daemon=True)
                self._thread.start()

    def leave(self, config: cc.ClientConfig, db: str, opener: int) -> None:
        with self._lock:
            self._rows.pop((db, opener), None)
        client = cc.Client(config)
        try:
            client.run("close", f"DELETE FROM {client.config.keyspace}.openers WHERE db = ? AND opener = ?",
                       (db, opener))
        except Exception:
            pass  # the row expires by itself

    @staticmethod
    def _renew_one(config: cc.ClientConfig, db: str, opener: int) -> None:
        """Its own Client: the database's counts only the database's round trips."""
        client = cc.Client(config)
        client.run("open", f"INSERT INTO {client.config.keyspace}.openers (db, opener) VALUES (?, ?) USING TTL ?",
                   (db, opener, OPENER_TTL))

    def _renew(self) -> None:
        while True:
            time.sleep(OPENER_TTL / 3)
            with self._lock:
                rows = list(self._rows.items()) if self._pid == os.getpid() else []
            for (db, opener), config in rows:
                try:
                    self._renew_one(config, db, opener)
                except Exception:
                    pass  # tried again in a third of the TTL


_OPENERS = _Openers()
# the parent's renewal thread may hold its lock at fork(); the child has no such thread
os.register_at_fork(after_in_child=lambda: setattr(_OPENERS, "_lock", threading.Lock()))

ADAPTER = CassandraAdapter
