"""Broken on purpose: sqlite_leased with the fence taken out. Its leases
still exclude live holders, but a holder paused past its lease writes over
the data of the process that took the lock after it."""

from __future__ import annotations

from dbwrap_py.adapters.sqlite_leased.adapter import SqliteLeasedAdapter


class NoFencingAdapter(SqliteLeasedAdapter):
    def _write(self, key: bytes, token: int, value: bytes | None) -> bool:
        """fenced_write's and end_lease's write, whoever holds the lease now."""
        self.sql.run("UPDATE seq SET n = n + 1")
        self.sql.store(key, value)
        return True


ADAPTER = NoFencingAdapter
BREAKS = frozenset({"lock.fencing"})
