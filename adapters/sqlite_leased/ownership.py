"""sqlite_leased's side of the node cache (dbwrap_py.nodecache.protocol), in SQL.

Where things are:

* the cluster file (option ``cluster_file``), ATTACHed as ``cluster`` by every
  connection here: ``nodes`` (each node's lease: its id and expiry),
  ``requests`` (release requests to a node, each with an expiry and, where
  a node asked, that node's lease), and
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
database file first (see ``Sql.transaction``) and only reads the cluster
file, save a hand-over's: its second statement removes the request it
serves, before it has read anything there, and so waits for the cluster
file's write lock as the first did for the database file's (had it read
there first, SQLite would refuse the write at once if another connection
had written the file since).

The node agent's store is in ``nodestore.py``. A release request lives
until its requester's lease would end (a process asks again each time it
tries the lock, which extends it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping

from dbwrap_py.adapters.sqlite_leased.client import NOW, Sql
from dbwrap_py.errors import FencedOut, Unavailable
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.ownership_base import ServedOwnership
from dbwrap_py.nodecache.protocol import Claim, OwnedElsewhere, Taken
from dbwrap_py.safe_files import sqlite_file

#: the cluster file's name where the option does not give one
CLUSTER_FILE = "sqlite_leased.cluster"
CLUSTER_SCHEMA = """CREATE TABLE IF NOT EXISTS cluster.nodes (name TEXT PRIMARY KEY, lease INTEGER UNIQUE, expires REAL);
CREATE TABLE IF NOT EXISTS cluster.requests (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT, db TEXT, k BLOB,
    expires REAL, requester_lease INTEGER, UNIQUE (node, db, k));
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
    add_requester_lease(conn)
    conn.create_function("bucket", 1, bucket_of, deterministic=True)
    if db is not None and path is not None:
        conn.execute("INSERT OR IGNORE INTO cluster.databases VALUES (?, ?)", (db.decode(), path))


def add_requester_lease(conn: sqlite3.Connection) -> None:
    """A cluster file the version before made has no ``requests.requester_lease``: add it."""
    if any(column[1] == "requester_lease" for column in conn.execute("PRAGMA cluster.table_info(requests)")):
        return
    try:
        conn.execute("ALTER TABLE cluster.requests ADD COLUMN requester_lease INTEGER")
    except sqlite3.OperationalError as exc:
        if "duplicate column" not in str(exc):  # else another opener added it meanwhile
            raise


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


class SqliteOwnership(ServedOwnership):
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

    def request_release(self, key: bytes, owner: bytes, requester_lease: int, requester: bytes = b"") -> None:
        # the request keeps the asking node's lease, for hand_over; none where a process asks
        self._sql().run("""INSERT INTO cluster.requests (node, db, k, expires, requester_lease)
                           SELECT ?, ?, ?, expires, ? FROM cluster.nodes WHERE lease = ?
                           ON CONFLICT DO UPDATE SET expires = excluded.expires,
                           requester_lease = excluded.requester_lease""",
                        (owner.decode(), self.db, key, requester_lease if requester else None, requester_lease))

    def _args(self, key: bytes, token: int) -> dict[str, object]:
        return {"k": key, "token": token, "bucket": bucket_of(key)}

    def write_back_fenced(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        sql = self._sql()
        with sql.transaction():  # its first statement ends the ownership, fenced
            return self._end(sql, key, value, token, via_bucket)

    def _end(self, sql: Sql, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        """In a transaction: the ownership ends, fenced (a record lock goes, a
        bucket's key is detached), and ``value`` is stored; False if ``token`` no longer holds."""
        end = (f"INSERT OR REPLACE INTO detached SELECT :k, :token WHERE EXISTS ({FENCES[True]}) RETURNING 1"
               if via_bucket else
               "DELETE FROM owners WHERE k = :k AND token = :token AND lease IN (SELECT lease FROM live_nodes)"
               " RETURNING 1")
        done = bool(sql.run(end, self._args(key, token)))
        if done:
            self._store(sql, key, value)
        return done

    def hand_over(self, key: bytes, value: bytes | None, token: int, via_bucket: bool,
                  node: bytes, lease: int) -> bool:
        """``write_back`` in one transaction that also removes the release
        request and, where a node's stands (unexpired, its lease live), puts
        that node's record lock on the key with a new token, as its own
        ``take`` would: its next take finds the hold its own."""
        sql = self._sql()
        with sql.transaction():
            new_token = sql.run("UPDATE tokens SET n = n + 1 RETURNING n")[0][0]  # writes this file first
            asked = sql.run(f"""DELETE FROM cluster.requests WHERE node = ? AND db = ? AND k = ?
                                RETURNING CASE WHEN expires > {NOW} THEN requester_lease END""",
                            (node.decode(), self.db, key))
            done = self._end(sql, key, value, token, via_bucket)
            if done and asked and asked[0][0] is not None:  # a node asked: the record is its own
                sql.run("INSERT OR REPLACE INTO owners SELECT ?, ?, name, lease, ? FROM live_nodes WHERE lease = ?",
                        (key, bucket_of(key), new_token, asked[0][0]))
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

    def drop_lock(self, key: bytes, node: bytes, lease: int) -> None:
        self._sql().run("DELETE FROM owners WHERE k = ? AND lease = ?", (key, lease))

    def served(self, node: bytes, key: bytes) -> None:
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
