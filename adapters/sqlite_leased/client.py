"""What sqlite_leased and its node-cache side need of SQLite and the host.

* ``NOW``: SQLite's clock in SQL, the one every lease here is judged by.
* ``Sql``: a connection that counts round trips (a transaction, or a
  statement outside one), maps "database is locked" to Timeout, and runs
  write transactions that lock only the file they write (see ``transaction``);
  its file is made with the mode asked, never through a planted link
  (``dbwrap_py.safe_files.sqlite_file``).
* ``hold_open`` / ``let_go_open``: the first-opener test of
  TDB_CLEAR_IF_FIRST, an fcntl lock as in the sqlite adapter: it goes with
  its process at once, and the processes sharing a WAL file share a host.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dbwrap_py.errors import Timeout, Unavailable
from dbwrap_py.safe_files import open_file, sqlite_file

#: SQLite's clock in Unix seconds; 'now' is one value for the whole of a statement
NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class Sql:
    """One connection (any thread may use it, one at a time) to ``path``,
    made with ``mode`` if missing."""

    def __init__(self, path: str, timeout: float, mode: int) -> None:
        try:
            self.conn = sqlite3.connect(sqlite_file(path, mode), timeout=timeout, isolation_level=None,
                                        check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:  # e.g. the database's directory was removed
            raise Unavailable(f"sqlite: {path}: {exc}") from exc
        self.round_trips = 0

    def run(self, sql: str, args: Any = ()) -> list[tuple[Any, ...]]:
        if not self.conn.in_transaction:
            self.round_trips += 1
        try:  # all rows: a statement with RETURNING commits only when it has run to its end
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:  # "database is locked": the busy timeout ran out
            raise (Timeout if "locked" in str(exc) else Unavailable)(f"sqlite: {exc}") from exc

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN DEFERRED, whose first statement must write: SQLite then takes
        this file's write lock (waiting as for any write) before it reads.
        BEGIN IMMEDIATE would lock every ATTACHed file too, the cluster file
        with it, and so serialise every database of the host."""
        if self.conn.in_transaction:  # the caller's transaction (persistent databases)
            yield
            return
        self.round_trips += 1
        self.conn.execute("BEGIN")
        try:
            yield
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def store(self, key: bytes, value: bytes | None) -> None:
        """Write a record (None: delete), in a transaction the caller fenced."""
        if value is None:
            self.conn.execute("DELETE FROM kv WHERE k = ?", (key,))
        else:
            self.conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))


_openers: dict[tuple[int, str], list[Any]] = {}  # (pid, path): [file, opens]; fcntl locks are per process


def hold_open(path: str, wipe: Callable[[], None] | None, mode: int) -> None:
    """Hold byte 0 of ``path`` (made with ``mode`` if missing) shared while
    this process has the database open; ``wipe`` first, under an exclusive
    lock, if no process has."""
    entry = _openers.get((os.getpid(), path))
    if entry is None:
        file = os.fdopen(open_file(path, mode), "r+b")
        try:
            try:
                fcntl.lockf(file, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                wipe = None  # others have it open
            if wipe is not None:
                wipe()  # other openers wait for it, in their LOCK_SH
            fcntl.lockf(file, fcntl.LOCK_SH, 1, 0)
        except BaseException:
            file.close()
            raise
        entry = _openers[(os.getpid(), path)] = [file, 0]
    entry[1] += 1


def let_go_open(path: str) -> None:
    entry = _openers.get((os.getpid(), path))
    if entry is not None and entry[1] > 0:
        entry[1] -= 1
        if entry[1] == 0:  # closing the file lets go of the lock: the next opener may wipe
            entry[0].close()
            del _openers[(os.getpid(), path)]
