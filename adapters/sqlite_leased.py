"""sqlite_leased: the sqlite example, with its record locks derived by the
framework (dbwrap_py.leased) from compare-and-set plus leases, with fencing.

It shows what an adapter for a store without process-bound locks writes: a
lease table and three atomic primitives. A killed holder's lock is free
after ``lease`` seconds (default 2); a holder paused past its lease, whose
lock someone else took, cannot write. Volatile databases are not emptied
on first open: leases, not processes, own this store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from dbwrap_py.adapter import Capabilities, DatabaseSpec
from dbwrap_py.errors import LockConflict
from dbwrap_py.leased import LEASE_OPTIONS, Lease, LeasedAdapter
from dbwrap_py.options import Options

SCHEMA = """CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (k BLOB PRIMARY KEY, token INTEGER, expires REAL);
CREATE TABLE IF NOT EXISTS seq (n INTEGER); INSERT INTO seq SELECT 0 WHERE NOT EXISTS (SELECT * FROM seq);"""
DEFAULT_LEASE = 2.0


class SqliteLeasedAdapter(LeasedAdapter):
    capabilities = Capabilities(transactions=True, lock_release_seconds=DEFAULT_LEASE)
    option_names = LEASE_OPTIONS
    default_lease = DEFAULT_LEASE

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        lease = float(options.get("lease", cls.default_lease))
        return Capabilities(transactions=True, lock_release_seconds=lease)

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self._inherited: list[sqlite3.Connection] = []  # a child never closes its parent's
        self._connect()

    def _connect(self) -> None:
        self.sql = sqlite3.connect(self.spec.name + ".sqlite", timeout=self.op_timeout,
                                   isolation_level=None)
        self.sql.executescript("PRAGMA journal_mode=WAL;" + SCHEMA)

    def _atomic(self, check_sql: str, args: tuple, want: object, *writes: tuple[str, tuple]) -> bool:
        """Run ``writes`` only if ``check_sql`` gives ``want``, in one transaction."""
        own = not self.sql.in_transaction
        if own:
            self.sql.execute("BEGIN IMMEDIATE")
        row = self.sql.execute(check_sql, args).fetchone()
        ok = (row[0] if row else None) == want
        if ok:
            for sql, wargs in writes:
                self.sql.execute(sql, wargs)
        if own:
            self.sql.execute("COMMIT")
        return ok

    # -- the primitives -------------------------------------------------------

    def read_lock(self, key: bytes) -> Lease | None:
        row = self.sql.execute("SELECT token, expires FROM leases WHERE k = ?", (key,)).fetchone()
        return Lease(row[0], row[1]) if row else None

    def swap_lock(self, key: bytes, expected: int | None, new: Lease | None) -> bool:
        write = ("INSERT OR REPLACE INTO leases VALUES (?, ?, ?)", (key, new.token, new.expires)) \
            if new else ("DELETE FROM leases WHERE k = ?", (key,))
        return self._atomic("SELECT token FROM leases WHERE k = ?", (key,), expected, write)

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        write = ("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value)) if value is not None \
            else ("DELETE FROM kv WHERE k = ?", (key,))
        return self._atomic("SELECT token FROM leases WHERE k = ?", (key,), token, write,
                            ("UPDATE seq SET n = n + 1", ()))

    # -- the rest ---------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        row = self.sql.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return row[0] if row else None

    def scan(self) -> list[tuple[bytes, bytes]]:
        return self.sql.execute("SELECT k, v FROM kv").fetchall()

    def seqnum(self) -> int:
        return self.sql.execute("SELECT n FROM seq").fetchone()[0]

    def transaction_start(self, nonblock: bool = False) -> None:
        try:
            self.sql.execute(f"PRAGMA busy_timeout = {0 if nonblock else int(self.op_timeout * 1000)}")
            self.sql.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise LockConflict(str(exc)) from exc
        finally:
            self.sql.execute(f"PRAGMA busy_timeout = {int(self.op_timeout * 1000)}")

    def transaction_commit(self) -> None:
        self.sql.execute("COMMIT")

    def transaction_cancel(self) -> None:
        self.sql.execute("ROLLBACK")

    def after_fork(self) -> None:
        super().after_fork()
        self._inherited.append(self.sql)
        self._connect()

    def close(self) -> None:
        self.sql.close()


ADAPTER = SqliteLeasedAdapter
