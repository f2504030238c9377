"""sqlite_leased: the sqlite example with record locks as leases
(dbwrap_py.leased) that SQLite itself judges, and with the node cache.

Leases: the table ``leases`` holds each record lock's token and expiry,
computed and compared by SQLite inside the statement that takes, checks or
ends the lease (``NOW``); no client sends a time. That clock is the host's,
read by SQLite in the process running the statement: one clock, since a
SQLite file in WAL mode is shared by the processes of one host only. A
killed holder's lock is free after ``lease`` seconds (default 2); a holder
paused past its lease, whose lock someone else took, cannot write. Each
primitive is one SQLite transaction, counted in ``round_trips``.

TDB_CLEAR_IF_FIRST: the first opener of a volatile database empties it (an
fcntl lock on ``<name>.sqlite.openers`` tells, as in the sqlite adapter).

Node cache (``node_cache = yes``, volatile databases): this adapter's side of
the protocol is ``ownership.py``. Node leases and release
requests span databases, so they live in one cluster file, option
``cluster_file`` (default: ``sqlite_leased.cluster`` in the database's
directory), which each volatile database's connection ATTACHes. A record
lock here is refused while a live node owns the record, and that node is
asked to hand it over. smbd and ``dbwrap-py node-agent --adapter
sqlite_leased -o cluster_file=FILE`` must name the same file.

SQLite plumbing (round trips, transactions, the opener lock): ``client.py``.
"""

from __future__ import annotations

import os
import sqlite3

from dbwrap_py.adapter import Capabilities, DatabaseSpec
from dbwrap_py.adapters.sqlite_leased import nodestore
from dbwrap_py.adapters.sqlite_leased import ownership as nodes
from dbwrap_py.adapters.sqlite_leased.client import NOW, Sql, hold_open, let_go_open
from dbwrap_py.errors import LockConflict
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, LeasedAdapter, LeaseSource, Keep
from dbwrap_py.options import Option, Options

SCHEMA = """CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (k BLOB PRIMARY KEY, token INTEGER, expires REAL);
CREATE TABLE IF NOT EXISTS seq (n INTEGER); INSERT INTO seq SELECT 0 WHERE NOT EXISTS (SELECT * FROM seq);"""
#: the lease to :token unless a live one, or a node ({nodes}), holds the key; and the record
TAKE = f"""INSERT INTO leases SELECT :k, :token, {NOW} + :seconds WHERE NOT ({{nodes}})
ON CONFLICT (k) DO UPDATE SET token = excluded.token, expires = excluded.expires WHERE expires <= {NOW}
RETURNING (SELECT v FROM kv WHERE kv.k = leases.k AND :read)"""
#: the fence: the sequence number moves only while the token's lease is live
FENCE = f"""UPDATE seq SET n = n + 1
WHERE EXISTS (SELECT 1 FROM leases WHERE k = ? AND token = ? AND expires > {NOW}) RETURNING n"""
#: the lease of :token made to last :seconds from now, while it is live
RENEW = f"UPDATE leases SET expires = {NOW} + :seconds WHERE k = :k AND token = :token AND expires > {NOW} RETURNING 1"
DEFAULT_LEASE = 2.0


class SqliteLeasedAdapter(LeasedAdapter):
    capabilities = Capabilities(transactions=True, lock_release_seconds=DEFAULT_LEASE)
    options_schema = (*LEASE_OPTIONS,
                      Option("cluster_file", str, "", help="the nodes file (default: beside the database)"))
    default_lease = DEFAULT_LEASE
    lease_source = LeaseSource.STORE_CLOCK

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        path = os.path.abspath(spec.name)
        self.cluster_file = options.value("cluster_file") or os.path.join(
            os.path.dirname(path), nodes.CLUSTER_FILE)
        self.node_cache_id = spec.cluster_name.encode()
        self.wipe_revision = 0  # the node cache voids ownership tokens up to it
        self._inherited: list[Sql] = []  # a child never closes its parent's
        self._connect(first_open=True)

    def _connect(self, first_open: bool = False) -> None:
        self.sql = Sql(self.spec.name + ".sqlite", self.op_timeout, self.spec.mode)
        self.sql.conn.executescript("PRAGMA journal_mode=WAL;" + SCHEMA)
        if not self.spec.persistent:
            # A volatile database is emptied by its first opener after a
            # restart, so a commit need not reach the disk: no fsync per
            # commit (WAL's NORMAL keeps the file consistent). Beside a
            # disk-heavy neighbour, 4 x 200 locked increments took 30 s
            # with one and 3-5 s without (stop 55).
            self.sql.conn.execute("PRAGMA synchronous=NORMAL")
        self._node_holds = "0"  # SQL: a node owns record :k; never, for a persistent database
        if not self.spec.persistent:
            nodes.attach(self.sql, self.cluster_file, self.spec.mode, self.node_cache_id,
                         os.path.abspath(self.spec.name))
            self._node_holds = nodes.NODE_HOLDS
            hold_open(self.spec.name + ".sqlite.openers", self._wipe if first_open else None, self.spec.mode)
            self.wipe_revision = nodes.wipe_revision(self.sql)

    def _wipe(self) -> None:
        with self.sql.transaction():
            self.sql.run("UPDATE seq SET n = n + 1")  # the first statement writes
            self.sql.run("DELETE FROM kv")
            self.sql.run("DELETE FROM leases")
            nodes.wipe(self.sql)  # and the nodes' ownerships, which no opener holds

    @property
    def round_trips(self) -> int:
        return self.sql.round_trips

    # -- the primitives -------------------------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        rows = self.sql.run(TAKE.format(nodes=self._node_holds),
                            {"k": key, "token": token, "seconds": seconds, "read": read})
        if not rows and not self.spec.persistent:
            nodes.ask_owner(self.sql, self.node_cache_id, key, seconds)  # if a node holds it
        return (True, rows[0][0]) if rows else (False, None)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        with self.sql.transaction():
            return self._write(key, token, value)

    def renew_lease(self, key: bytes, token: int, seconds: float) -> bool:
        return bool(self.sql.run(RENEW, {"k": key, "token": token, "seconds": seconds}))

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        with self.sql.transaction():
            written = value is KEEP or self._write(key, token, value)
            self.sql.run("DELETE FROM leases WHERE k = ? AND token = ?", (key, token))
        return written

    def _write(self, key: bytes, token: int, value: bytes | None) -> bool:
        if not self.sql.run(FENCE, (key, token)):  # the transaction's first statement: a write
            return False
        self.sql.store(key, value)
        return True

    # -- the rest ---------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value, by_node = self.sql.run(f"SELECT (SELECT v FROM kv WHERE k = :k), {self._node_holds}",
                                      {"k": key})[0]
        return self.read_from_its_node(key) if by_node else value

    def scan(self) -> list[tuple[bytes, bytes]]:
        return self.sql.run("SELECT k, v FROM kv")

    def seqnum(self) -> int:
        return self.sql.run("SELECT n FROM seq")[0][0]

    def transaction_start(self, nonblock: bool = False) -> None:
        conn = self.sql.conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {0 if nonblock else int(self.op_timeout * 1000)}")
            conn.execute("BEGIN IMMEDIATE")  # persistent: nothing is attached
        except sqlite3.OperationalError as exc:
            raise LockConflict(str(exc)) from exc
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self.op_timeout * 1000)}")

    def transaction_commit(self) -> None:
        self.sql.conn.execute("COMMIT")

    def transaction_cancel(self) -> None:
        self.sql.conn.execute("ROLLBACK")

    def after_fork(self) -> None:
        super().after_fork()
        self._inherited.append(self.sql)
        self._connect()

    def close(self) -> None:
        self.sql.conn.close()
        if not self.spec.persistent:
            let_go_open(self.spec.name + ".sqlite.openers")

    # -- the node cache (dbwrap_py.nodecache.protocol) ----------------------------

    @classmethod
    def node_store(cls, options: Options) -> nodestore.SqliteNodeStore:
        """The node agent's side (``dbwrap-py node-agent --adapter sqlite_leased``)."""
        return nodestore.SqliteNodeStore.from_options(options)

    def ownership(self) -> nodes.SqliteOwnership:
        return nodes.SqliteOwnership(lambda: self.sql, self.node_cache_id, self.op_timeout)


ADAPTER = SqliteLeasedAdapter
