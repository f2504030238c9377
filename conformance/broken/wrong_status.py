"""Broken on purpose: deleting a missing key reports success (rbt's answer)
where Samba's tdb callers expect NT_STATUS_NOT_FOUND."""

from __future__ import annotations

from dbwrap_py.adapters.sqlite import SqliteAdapter


class WrongStatusAdapter(SqliteAdapter):
    def remove(self, key: bytes) -> bool:
        super().remove(key)
        return True


ADAPTER = WrongStatusAdapter
BREAKS = frozenset({"kv.missing"})
