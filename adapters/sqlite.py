"""sqlite: records in <name>.sqlite; record locks are fcntl byte-range locks on
<name>.sqlite.locks, so they die with their holder as tdb's do. Byte 0 is the
"active" lock that gives TDB_CLEAR_IF_FIRST tdb's meaning."""

import fcntl
import hashlib
import os
import sqlite3
import time

from dbwrap_py import Adapter, Capabilities, LockConflict, Option
from dbwrap_py.safe_files import open_file, sqlite_file

SCHEMA = """CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS seq (n INTEGER); INSERT INTO seq SELECT 0 WHERE NOT EXISTS (SELECT * FROM seq);"""
_lock_files = {}  # fcntl locks are per process: one lock file per database, as tdb_wrap


class SqliteAdapter(Adapter):
    capabilities = Capabilities(transactions=True)
    options_schema = (Option("timeout", float, 30.0, minimum=0.0, help="seconds to wait for sqlite's write lock"),)

    def __init__(self, spec, options):
        super().__init__(spec, options)
        self.timeout = options.value("timeout")
        self._inherited = []  # a forked child never closes its parent's handles
        self._connect()

    def _connect(self):
        # the files get the mode Samba asks for, and a link planted at their names is refused
        path = sqlite_file(self.spec.name + ".sqlite", self.spec.mode)
        self.sql = sqlite3.connect(path, timeout=self.timeout, isolation_level=None)
        # switching to WAL fails at once ("database is locked") while another
        # process opens the file, whatever the timeout: set it only once
        deadline = time.monotonic() + self.timeout
        while self.sql.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            try:
                self.sql.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        self.sql.executescript(SCHEMA)
        path = self.spec.name + ".sqlite.locks"
        if path not in _lock_files:
            self.locks = _lock_files[path] = os.fdopen(open_file(path, self.spec.mode), "r+b")
            try:  # the first opener of a volatile database empties it
                fcntl.lockf(self.locks, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
                if not self.spec.persistent:
                    self.sql.execute("DELETE FROM kv")
            except OSError:
                pass
            fcntl.lockf(self.locks, fcntl.LOCK_SH, 1, 0)
        self.locks = _lock_files[path]

    def _write(self, sql, args):  # the sequence number moves in the same transaction
        own = not self.sql.in_transaction
        if own:
            self.sql.execute("BEGIN IMMEDIATE")
        self.sql.execute(sql, args)
        self.sql.execute("UPDATE seq SET n = n + 1")
        if own:
            self.sql.execute("COMMIT")

    def get(self, key):
        row = self.sql.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key, value):
        self._write("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))

    def remove(self, key):
        existed = self.get(key) is not None
        if existed:
            self._write("DELETE FROM kv WHERE k = ?", (key,))
        return existed

    def scan(self):
        return self.sql.execute("SELECT k, v FROM kv").fetchall()

    def lock(self, key, how=fcntl.LOCK_EX):
        offset = 1 + int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "big")
        fcntl.lockf(self.locks, how, 1, offset)

    def unlock(self, key):
        self.lock(key, fcntl.LOCK_UN)

    def seqnum(self):
        return self.sql.execute("SELECT n FROM seq").fetchone()[0]

    def transaction_start(self, nonblock=False):
        try:
            self.sql.execute(f"PRAGMA busy_timeout = {0 if nonblock else int(self.timeout * 1000)}")
            self.sql.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise LockConflict(str(exc)) from exc
        finally:
            self.sql.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    def transaction_commit(self):
        self.sql.execute("COMMIT")

    def transaction_cancel(self):
        self.sql.execute("ROLLBACK")

    def after_fork(self):  # reconnect; the parent's handles stay open, unused
        self._inherited.append((self.sql, _lock_files.pop(self.spec.name + ".sqlite.locks", None)))
        self._connect()

    def close(self):
        self.sql.close()


ADAPTER = SqliteAdapter
