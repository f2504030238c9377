"""sqlite_leased: the sqlite example with record locks as leases
(dbwrap_py.leased) that SQLite itself judges.

Leases: the table ``leases`` holds each record lock's token and expiry,
computed and compared by SQLite inside the statement that takes, checks or
ends the lease (``NOW``); no client sends a time. That clock is the host's,
read by SQLite in the process running the statement: one clock, since a
SQLite file in WAL mode is shared by the processes of one host only. A
killed holder's lock is free after ``lease`` seconds (default 2); a holder
paused past its lease, whose lock someone else took, cannot write. Each
primitive is one SQLite transaction, counted in ``round_trips``.

Volatile databases are not emptied on first open: leases, not processes,
own this store.

SQLite plumbing (round trips, transactions): ``_sqlite_leased_client``.
"""

from __future__ import annotations

import sqlite3

from dbwrap_py.adapter import Capabilities, DatabaseSpec
from dbwrap_py.adapters._sqlite_leased_client import NOW, Sql
from dbwrap_py.errors import LockConflict
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, LeasedAdapter, LeaseSource, Keep
from dbwrap_py.options import Options

SCHEMA = """CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (k BLOB PRIMARY KEY, token INTEGER, expires REAL);
CREATE TABLE IF NOT EXISTS seq (n INTEGER); INSERT INTO seq SELECT 0 WHERE NOT EXISTS (SELECT * FROM seq);"""
#: the lease to :token unless a live one holds the key; and the record
TAKE = f"""INSERT INTO leases VALUES (:k, :token, {NOW} + :seconds)
ON CONFLICT (k) DO UPDATE SET token = excluded.token, expires = excluded.expires WHERE expires <= {NOW}
RETURNING (SELECT v FROM kv WHERE kv.k = leases.k AND :read)"""
#: the fence: the sequence number moves only while the token's lease is live
FENCE = f"""UPDATE seq SET n = n + 1
WHERE EXISTS (SELECT 1 FROM leases WHERE k = ? AND token = ? AND expires > {NOW}) RETURNING n"""
DEFAULT_LEASE = 2.0


class SqliteLeasedAdapter(LeasedAdapter):
    capabilities = Capabilities(transactions=True, lock_release_seconds=DEFAULT_LEASE)
    option_names = LEASE_OPTIONS
    default_lease = DEFAULT_LEASE
    lease_source = LeaseSource.STORE_CLOCK

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self._inherited: list[Sql] = []  # a child never closes its parent's
        self._connect()

    def _connect(self) -> None:
        self.sql = Sql(self.spec.name + ".sqlite", self.op_timeout)
        self.sql.conn.executescript("PRAGMA journal_mode=WAL;" + SCHEMA)

    @property
    def round_trips(self) -> int:
        return self.sql.round_trips

    # -- the primitives -------------------------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        rows = self.sql.run(TAKE, {"k": key, "token": token, "seconds": seconds, "read": read})
        return (True, rows[0][0]) if rows else (False, None)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        with self.sql.transaction():
            return self._write(key, token, value)

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
        rows = self.sql.run("SELECT v FROM kv WHERE k = ?", (key,))
        return rows[0][0] if rows else None

    def scan(self) -> list[tuple[bytes, bytes]]:
        return self.sql.run("SELECT k, v FROM kv")

    def seqnum(self) -> int:
        return self.sql.run("SELECT n FROM seq")[0][0]

    def transaction_start(self, nonblock: bool = False) -> None:
        conn = self.sql.conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {0 if nonblock else int(self.op_timeout * 1000)}")
            conn.execute("BEGIN IMMEDIATE")
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


ADAPTER = SqliteLeasedAdapter
