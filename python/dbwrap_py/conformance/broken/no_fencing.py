"""Broken on purpose: sqlite_leased with the fence taken out. Its leases
still exclude live holders, but a holder paused past its lease writes over
the data of the process that took the lock after it."""

from __future__ import annotations

from dbwrap_py.adapters.sqlite_leased import SqliteLeasedAdapter


class NoFencingAdapter(SqliteLeasedAdapter):
    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        if value is None:
            self.sql.execute("DELETE FROM kv WHERE k = ?", (key,))
        else:
            self.sql.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))
        self.sql.execute("UPDATE seq SET n = n + 1")
        return True


ADAPTER = NoFencingAdapter
BREAKS = frozenset({"lock.fencing"})
