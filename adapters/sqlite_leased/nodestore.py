"""sqlite_leased's node agent store: node leases and release requests in the
cluster file (``ownership.py`` says where things are).

No watch in SQLite: an agent's ``requests()`` polls the table every
POLL_SECONDS.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

from dbwrap_py.adapters.sqlite_leased.client import NOW, Sql
from dbwrap_py.adapters.sqlite_leased.ownership import CLUSTER_FILE, SqliteOwnership, attach
from dbwrap_py.errors import ConfigError, Unavailable
from dbwrap_py.nodecache.ownership_base import PerDatabase, grant_retrying, new_requests
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served
from dbwrap_py.options import Options

#: how often an agent looks for release requests
POLL_SECONDS = 0.005
#: the mode of the files the agent makes (a database's opener makes them with the database's)
AGENT_FILE_MODE = 0o600


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

    def requests(self, node: bytes, stop: threading.Event) -> Iterator[tuple[bytes, bytes] | Served]:
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
        self.database(db_id).served(node, key)

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
