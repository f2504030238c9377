"""sqlite_leased's side of the node cache (dbwrap_py.nodecache.protocol), in SQL.

Where things are:

* the cluster file (option ``cluster_file``), ATTACHed as ``cluster`` by every
  connection here: ``nodes`` (each node's lease: its id and expiry),
  ``requests`` (release requests to a node, each with an expiry), and
  ``databases`` (each database's node-cache id and path, so that an agent
  can open it);
* each database's own file, beside its records: ``owners`` (record locks
  held by a node), ``claims`` (buckets claimed by a node), ``detached``
  (keys handed out of a claim) and ``tokens`` (the counter every ownership
  token is drawn from, and its value at the last CLEAR_IF_FIRST wipe: the
  node cache voids tokens up to it).

A node's owners, claims and detached marks hold while its lease does: while
its row in ``nodes`` has not expired by SQLite's clock (``NOW``), read in the
statement that relies on it, as sqlite_leased's own leases are; a keepalive
cannot revive an expired lease. Every write-back is fenced, in the same
transaction, on the token and on that lease. A transaction here writes the
database file first and only reads the cluster file (see ``Sql.transaction``).

No watch in SQLite: an agent's ``requests()`` polls the table every
POLL_SECONDS. A request lives until its requester's lease would end (a
process asks again each time it tries the lock, which extends it).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from dbwrap_py.adapters.sqlite_leased.client import NOW, Sql
from dbwrap_py.errors import ConfigError, FencedOut, Unavailable
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import PerDatabase, grant_retrying, new_requests
from dbwrap_py.nodecache.protocol import Claim, NodeLease, NodeStore, OwnedElsewhere, Ownership, Taken
from dbwrap_py.options import Options
from dbwrap_py.safe_files import sqlite_file

#: how often an agent looks for release requests
POLL_SECONDS = 0.005
#: the cluster file's name where the option does not give one
CLUSTER_FILE = "sqlite_leased.cluster"
#: the mode of the files the agent makes (a database's opener makes them with the database's)
AGENT_FILE_MODE = 0o600
CLUSTER_SCHEMA = """CREATE TABLE IF NOT EXISTS cluster.nodes (name TEXT PRIMARY KEY, lease INTEGER UNIQUE, expires REAL);
CREATE TABLE IF NOT EXISTS cluster.requests (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT, db TEXT, k BLOB,
    expires REAL, UNIQUE (node, db, k));
CREATE TABLE IF NOT EXISTS cluster.databases (id TEXT PRIMARY KEY, path TEXT NOT NULL);"""
DATABASE_SCHEMA = """CREATE TABLE IF NOT EXISTS owners (k BLOB PRIMARY KEY, bucket INTEGER, node TEXT, lease INTEGER, token INTEGER);
CREATE INDEX IF NOT EXISTS owners_bucket ON owners (bucket);
CREATE TABLE IF NOT EXISTS claims (bucket INTEGER PRIMARY KEY, node TEXT, lease INTEGER, token INTEGER);
CREATE TABLE IF NOT EXISTS detached (k BLOB PRIMARY KEY, token INTEGER);
CREATE TABLE IF NOT EXISTS tokens (n INTEGER, wiped INTEGER);
INSERT INTO tokens SELECT 0, 0 WHERE NOT EXISTS (SELECT * FROM tokens);"""
#: what holds while a node's lease does (temporary views: per connection)
VIEWS = f"""CREATE TEMP VIEW IF NOT EXISTS live_nodes AS SELECT name, lease FROM cluster.nodes WHERE expires > {NOW};
CREATE TEMP VIEW IF NOT EXISTS node_locks AS SELECT o.* FROM main.owners o JOIN live_nodes USING (lease);
CREATE TEMP VIEW IF NOT EXISTS node_claims AS SELECT c.* FROM main.claims c JOIN live_nodes USING (lease);"""
#: the live node that holds record :k, by its record lock or by its bucket (if :k was not detached from it)
HOLDER = """SELECT node FROM node_locks WHERE k = :k UNION ALL SELECT node FROM node_claims c
WHERE bucket = bucket(:k) AND NOT EXISTS (SELECT 1 FROM detached d WHERE d.k = :k AND d.token = c.token)"""
#: for sqlite_leased's own record locks and reads
NODE_HOLDS = f"EXISTS ({HOLDER})"
#: the fence of a write-back: the ownership with :token, on a live lease
FENCES = {False: "SELECT 1 FROM node_locks WHERE k = :k AND token = :token",
          True: "SELECT 1 FROM node_claims WHERE bucket = :bucket AND token = :token"}


def attach(sql: Sql, cluster_file: str, mode: int, db: bytes | None = None, path: str | None = None) -> None:
    """ATTACH the cluster file (made with ``mode`` if missing), and make
    what the node cache uses: the tables (database ``db``'s too, if given),
    the views, SQL's ``bucket()``; an opener registers ``db`` at ``path``,
    for the agents."""
    conn = sql.conn
    try:
        conn.execute("ATTACH DATABASE ? AS cluster", (sqlite_file(cluster_file, mode),))
    except OSError as exc:
        raise Unavailable(f"sqlite: {cluster_file}: {exc}") from exc
    conn.executescript("PRAGMA cluster.journal_mode=WAL;" + CLUSTER_SCHEMA
                       + (DATABASE_SCHEMA if db is not None else "") + VIEWS)
    conn.create_function("bucket", 1, bucket_of, deterministic=True)
    if db is not None and path is not None:
        conn.execute("INSERT OR IGNORE INTO cluster.databases VALUES (?, ?)", (db.decode(), path))


def wipe(sql: Sql) -> None:
    """Inside the first opener's wipe: every node's ownership goes, and tokens so far are void."""
    for table in ("owners", "claims", "detached"):
        sql.run(f"DELETE FROM {table}")
    sql.run("UPDATE tokens SET wiped = n")


def wipe_revision(sql: Sql) -> int:
    return sql.run("SELECT wiped FROM tokens")[0][0]


def ask_owner(sql: Sql, db: bytes, key: bytes, seconds: float) -> None:
    """A process waiting for ``key``: ask the node holding it, if any, to hand it back."""
    sql.run(f"""INSERT INTO cluster.requests (node, db, k, expires) SELECT node, :db, :k, {NOW} + :seconds
                FROM ({HOLDER}) WHERE true ON CONFLICT DO UPDATE SET expires = excluded.expires""",
            {"db": db.decode(), "k": key, "seconds": seconds})


class SqliteOwnership(Ownership):
    """One database's ownership operations, on ``sql()`` (the adapter's
    connection, which a fork replaces, or the agent's)."""

    def __init__(self, sql: Callable[[], Sql], db: bytes, op_timeout: float) -> None:
        self._sql = sql
        self.db = db.decode()
        self.op_timeout = op_timeout

    def _begin(self, lease: int) -> int:
        """A transaction's first statement (it writes): the next token. Then
        the node's own lease must be live: a take under a dead one holds nothing."""
        sql = self._sql()
        token = sql.run("UPDATE tokens SET n = n + 1 RETURNING n")[0][0]
        if not sql.run("SELECT 1 FROM live_nodes WHERE lease = ?", (lease,)):
            raise FencedOut(f"node lease {lease:x} is not live in the cluster file "
                            "(do the node agent and smbd name the same cluster_file?)")
        return token

    def take(self, key: bytes, node: bytes, lease: int) -> Taken:
        sql = self._sql()
        with sql.transaction():
            token = self._begin(lease)
            value = sql.run("SELECT v FROM kv WHERE k = ?", (key,))
            value = value[0][0] if value else None
            if sql.run(f"SELECT 1 FROM leases WHERE k = ? AND expires > {NOW}", (key,)):
                raise OwnedElsewhere(None, f"{key!r} is locked by a process")
            for holder, held_lease, held_token in sql.run(
                    "SELECT node, lease, token FROM node_locks WHERE k = ?", (key,)):
                if held_lease != lease:
                    raise OwnedElsewhere(holder.encode(), f"{key!r} is locked by node {holder}")
                return Taken(value, held_token)  # a taker of ours died before keeping it
            for holder, held_lease, held_token in sql.run(
                    "SELECT node, lease, token FROM node_claims c WHERE bucket = ? AND NOT EXISTS"
                    " (SELECT 1 FROM detached d WHERE d.k = ? AND d.token = c.token)", (bucket_of(key), key)):
                if held_lease != lease:
                    raise OwnedElsewhere(holder.encode(), f"{key!r}'s bucket is node {holder}'s")
                return Taken(value, held_token, via_bucket=True)
            # free, or detached from its bucket: owned record by record
            sql.run("INSERT OR REPLACE INTO owners VALUES (?, ?, ?, ?, ?)",
                    (key, bucket_of(key), node.decode(), lease, token))
        return Taken(value, token)

    def claim(self, bucket: int, node: bytes, lease: int) -> Claim | None:
        sql = self._sql()
        with sql.transaction():
            token = self._begin(lease)
            if sql.run(f"""SELECT 1 FROM node_claims WHERE bucket = :b UNION ALL
                           SELECT 1 FROM node_locks WHERE bucket = :b UNION ALL
                           SELECT 1 FROM leases WHERE bucket(k) = :b AND expires > {NOW}""", {"b": bucket}):
                return None
            # a dead claim's detached marks go with it (nothing of a live claim is left)
            sql.run("DELETE FROM detached WHERE token IN (SELECT token FROM claims WHERE bucket = ?)", (bucket,))
            sql.run("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?)", (bucket, node.decode(), lease, token))
            # every record is read to find the bucket's: SQL cannot compute the CRC-32 in an index
            records = sql.run("SELECT k, v FROM kv WHERE bucket(k) = ?", (bucket,))
        return Claim(token, dict(records))

    def request_release(self, key: bytes, owner: bytes, requester_lease: int) -> None:
        self._sql().run("""INSERT INTO cluster.requests (node, db, k, expires)
                           SELECT ?, ?, ?, expires FROM cluster.nodes WHERE lease = ?
                           ON CONFLICT DO UPDATE SET expires = excluded.expires""",
                        (owner.decode(), self.db, key, requester_lease))

    def _args(self, key: bytes, token: int) -> dict[str, object]:
        return {"k": key, "token": token, "bucket": bucket_of(key)}

    def write_back(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                   node: bytes, lease: int) -> bool:
        sql = self._sql()
        # the first statement ends the ownership, fenced: a record lock goes, a bucket's key is detached
        end = (f"INSERT OR REPLACE INTO detached SELECT :k, :token WHERE EXISTS ({FENCES[True]}) RETURNING 1"
               if via_bucket else
               "DELETE FROM owners WHERE k = :k AND token = :token AND lease IN (SELECT lease FROM live_nodes)"
               " RETURNING 1")
        with sql.transaction():
            done = bool(sql.run(end, self._args(key, token)))
            if done:
                self._store(sql, key, value)
        self._served(node, key)
        return done

    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        sql = self._sql()
        with sql.transaction():
            if not sql.run(f"UPDATE seq SET n = n + 1 WHERE EXISTS ({FENCES[via_bucket]}) RETURNING 1",
                           self._args(key, token)):
                return False
            sql.store(key, value)
        return True

    @staticmethod
    def _store(sql: Sql, key: bytes, value: bytes | None) -> None:
        sql.store(key, value)
        sql.run("UPDATE seq SET n = n + 1")

    def let_go(self, key: bytes, node: bytes, lease: int) -> None:
        self._sql().run("DELETE FROM owners WHERE k = ? AND lease = ?", (key, lease))
        self._served(node, key)

    def _served(self, node: bytes, key: bytes) -> None:
        self._sql().run("DELETE FROM cluster.requests WHERE node = ? AND db = ? AND k = ?",
                        (node.decode(), self.db, key))

    def release_bucket(self, bucket: int, token: int, records: Mapping[bytes, bytes | None]) -> bool:
        sql = self._sql()
        with sql.transaction():
            if not sql.run("DELETE FROM claims WHERE bucket = ? AND token = ?"
                           " AND lease IN (SELECT lease FROM live_nodes) RETURNING 1", (bucket, token)):
                return False
            sql.run("DELETE FROM detached WHERE token = ?", (token,))
            for key, value in records.items():
                self._store(sql, key, value)
        return True

    def owner(self, key: bytes) -> bytes | None:
        rows = self._sql().run(HOLDER, {"k": key})
        return rows[0][0].encode() if rows else None

    def owners(self) -> frozenset[bytes]:
        rows = self._sql().run("SELECT node FROM node_locks UNION SELECT node FROM node_claims")
        return frozenset(row[0].encode() for row in rows)

    def request_waiting(self, key: bytes, owner: bytes, requester_lease: int) -> bool:
        # extended as it is looked at: an expired request would look served
        return bool(self._sql().run("""UPDATE cluster.requests SET expires = (SELECT expires FROM cluster.nodes
                                       WHERE lease = ?) WHERE node = ? AND db = ? AND k = ? RETURNING 1""",
                                    (requester_lease, owner.decode(), self.db, key)))


class SqliteNodeStore(NodeStore):
    """The node agent's side: node leases and requests in the cluster file.
    Each thread (the agent's keepalive and request threads) has its own connection."""

    def __init__(self, cluster_file: str, op_timeout: float) -> None:
        self.cluster_file = cluster_file
        self.op_timeout = op_timeout
        self._local = threading.local()
        self._connections: list[Sql] = []
        self._databases = PerDatabase(self._open)

    @classmethod
    def from_options(cls, options: Options) -> "SqliteNodeStore":
        cluster_file = options.get_str("cluster_file", "")
        if not cluster_file:
            raise ConfigError(f"sqlite_leased's node agent needs -o cluster_file=FILE: the file smbd's "
                              f"databases use (by default {CLUSTER_FILE} in their directory)")
        return cls(cluster_file, options.get_float("op_timeout", 10.0, minimum=0.0))

    def _connect(self, path: str, db: bytes | None = None, *, closed_by_close: bool = True) -> Sql:
        sql = Sql(path, self.op_timeout, AGENT_FILE_MODE)  # a database's file: its opener made the tables
        attach(sql, self.cluster_file, AGENT_FILE_MODE, db)
        if closed_by_close:
            self._connections.append(sql)
        return sql

    def _cluster(self) -> Sql:
        sql = getattr(self._local, "sql", None)
        if sql is None:
            sql = self._local.sql = self._connect(":memory:")
        return sql

    def grant(self, node: bytes, ttl: float) -> NodeLease:
        def attempt() -> int:  # the new lease, 0 while a live agent has the name
            lease = secrets.randbits(63) or 1
            return lease if self._cluster().run(f"""INSERT INTO cluster.nodes VALUES (?, ?, {NOW} + ?) ON CONFLICT
                (name) DO UPDATE SET lease = excluded.lease, expires = excluded.expires WHERE expires <= {NOW}
                RETURNING 1""", (node.decode(), lease, ttl)) else 0

        return NodeLease(grant_retrying(node, attempt, ttl, self.op_timeout), ttl)

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        sql = self._cluster()
        sql.conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        renewed = sql.run(f"UPDATE cluster.nodes SET expires = {NOW} + ? WHERE lease = ? AND expires > {NOW}"
                          " RETURNING 1", (lease.ttl, lease.id))
        return lease.ttl if renewed else 0.0

    def revoke(self, lease: NodeLease) -> None:
        self._cluster().run("DELETE FROM cluster.nodes WHERE lease = ?", (lease.id,))

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes]]:
        # Its own connection, closed here as it ends (within POLL_SECONDS of
        # stop), never by close() from another thread while it is in use:
        # Python's sqlite3 may crash on a connection closed under a query.
        sql = self._connect(":memory:", closed_by_close=False)
        next_cleanup = [0.0]

        def read() -> dict[int, tuple[bytes, bytes]]:
            if time.monotonic() >= next_cleanup[0]:  # requests whose requesters stopped asking
                sql.run(f"DELETE FROM cluster.requests WHERE expires <= {NOW}")
                next_cleanup[0] = time.monotonic() + 1.0
            rows = sql.run(f"SELECT id, db, k FROM cluster.requests WHERE node = ? AND expires > {NOW}",
                           (node.decode(),))
            return {request: (db.encode(), key) for request, db, key in rows}  # by id: asked again is new

        try:
            yield from new_requests(read, lambda: stop.wait(POLL_SECONDS), stop)
        finally:
            sql.conn.close()

    def done(self, node: bytes, db_id: bytes, key: bytes) -> None:
        self.database(db_id)._served(node, key)

    def database(self, db_id: bytes) -> SqliteOwnership:
        """For the agent's main thread: its connection to the database's file."""
        return self._databases(db_id)

    def _open(self, db_id: bytes) -> SqliteOwnership:
        rows = self._cluster().run("SELECT path FROM cluster.databases WHERE id = ?", (db_id.decode(),))
        if not rows:
            raise Unavailable(f"database {db_id.decode()!r} is not in {self.cluster_file}")
        sql = self._connect(rows[0][0] + ".sqlite", db_id)
        return SqliteOwnership(lambda: sql, db_id, self.op_timeout)

    def close(self) -> None:
        for sql in self._connections:
            sql.conn.close()
