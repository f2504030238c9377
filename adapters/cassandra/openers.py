"""The cassandra adapter's side of TDB_CLEAR_IF_FIRST's openers: the
primitives ``dbwrap_py.openers`` asks of a store, for one volatile database.

* exclusive: the ``opening`` LWT lock of the database's row in
  ``databases`` (with a TTL of op_timeout), tried again until op_timeout and
  let go until it is known gone;
* others_open: a live row in ``openers`` (rows with a TTL, ``OPENER_TTL``);
* opened: the first opener starts a new generation (the wipe: one LWT,
  not a delete per record) and chooses the layout; later ones follow the
  generation's layout (and count an open of a TDB_SEQNUM database);
* register/unregister: the opener's row, on a Client of its own (the
  database's counts only the database's round trips).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.adapters.cassandra.schema import BUMP_SEQNUM
from dbwrap_py.errors import Timeout
from dbwrap_py.retry import retry_until

#: seconds an opener's row lives unless renewed (dbwrap_py.openers renews every third of it)
OPENER_TTL = 10
#: a ``databases`` row that is not there yet
_NO_ROW = type("NoRow", (), {"opening": None, "generation": None, "layout": None})()


class CassandraOpeners:
    """One volatile database's openers: ``generation`` and ``layout`` are
    what the open found or chose."""

    ttl: float | None = OPENER_TTL

    def __init__(self, client: cc.Client, name: str, layout: str, bump_seqnum: bool) -> None:
        self.client, self.config, self.name = client, client.config, name
        self.ks = client.config.keyspace
        self.layout, self.generation = layout, 0
        self._bump_seqnum = bump_seqnum
        self._lock = 0  # the open lock's value while held

    def __repr__(self) -> str:
        return f"cassandra openers of {self.name}"

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        lock = secrets.randbits(63)
        deadline = time.monotonic() + self.config.op_timeout
        self._take_open_lock(lock, deadline)
        self._lock = lock
        try:
            yield
        finally:
            self._lock = 0
            self._let_open_lock_go(lock, deadline)

    def others_open(self) -> bool:
        return bool(self.client.run("open", f"SELECT opener FROM {self.ks}.openers WHERE db = ? LIMIT 1",
                                    (self.name,)))

    def opened(self, first: bool) -> None:
        row = self._open_row()
        self.generation = row.generation or 0
        if first:
            self.generation += 1
            self._set_open_row("generation = ?, layout = ?", (self.generation, self.layout),
                               lambda found: found.generation == self.generation)
        elif row.layout is None:  # a database from before layouts, or opened without CLEAR_IF_FIRST
            self._set_open_row("layout = ?", (self.layout,), lambda found: found.layout == self.layout)
        else:
            self.layout = row.layout  # the generation's first opener chose it
            if self._bump_seqnum:
                self.client.run("open", BUMP_SEQNUM.format(ks=self.ks), (self.name,), idempotent=False)

    def register(self, opener: int) -> None:
        cc.Client(self.config).run("open", f"INSERT INTO {self.ks}.openers (db, opener) VALUES (?, ?) USING TTL ?",
                                   (self.name, opener, OPENER_TTL))

    def unregister(self, opener: int) -> None:
        cc.Client(self.config).run("close", f"DELETE FROM {self.ks}.openers WHERE db = ? AND opener = ?",
                                   (self.name, opener))

    # -- the open lock ------------------------------------------------------------------

    def _take_open_lock(self, lock: int, deadline: float) -> None:
        """The ``opening`` LWT lock of the database's row, tried again until ``deadline``."""
        ttl = max(int(self.config.op_timeout), 1)
        for _ in retry_until(deadline, cc.CONTENDED):
            if self.client.applied("open", f"UPDATE {self.ks}.databases USING TTL ? SET opening = ? "
                                   "WHERE db = ? IF opening = null", (ttl, lock, self.name),
                                   unknown=lambda: self._open_row().opening == lock):  # contended Paxos: who holds it
                return
        raise Timeout(f"{self.name}: another opener held the open lock past op_timeout")

    def _open_row(self) -> Any:
        """The database's row at SERIAL: ``opening`` (the open lock), ``generation`` and ``layout``."""
        rows = self.client.run("open", f"SELECT opening, generation, layout FROM {self.ks}.databases "
                               "WHERE db = ?", (self.name,), serial=True)
        return rows[0] if rows else _NO_ROW

    def _set_open_row(self, assignments: str, args: tuple[Any, ...], done: Any) -> None:
        """Change the database's row while the open lock is still ours."""
        if not self.client.applied("open", f"UPDATE {self.ks}.databases SET {assignments} WHERE db = ? IF opening = ?",
                                   (*args, self.name, self._lock), unknown=lambda: done(self._open_row())):
            raise Timeout(f"{self.name}: the open lock expired before the open was done (op_timeout)")

    def _let_open_lock_go(self, lock: int, deadline: float) -> None:
        """Until it is known gone: a release lost in contention would keep
        every other opener waiting for its TTL; past ``deadline``, left to its TTL."""
        for _ in retry_until(deadline, cc.CONTENDED):
            try:
                self.client.lwt("open", f"UPDATE {self.ks}.databases SET opening = null "
                                "WHERE db = ? IF opening = ?", (self.name, lock))
                return
            except cc.OutcomeUnknown:
                if self._open_row().opening != lock:
                    return  # gone
