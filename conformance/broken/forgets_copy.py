"""Broken on purpose: the durable copies of persistent records are never
kept. Writes to a "<name>_persistent.tdb" database (where the bridge keeps
them, c_bridge/per_rec_persistent.c) are accepted and dropped, so a
persistent handle's record looks stored but does not survive a restart."""

from __future__ import annotations

from dbwrap_py.adapters.sqlite import SqliteAdapter


class ForgetsCopyAdapter(SqliteAdapter):
    def put(self, key: bytes, value: bytes) -> None:
        if not self.spec.name.endswith("_persistent.tdb"):
            super().put(key, value)


ADAPTER = ForgetsCopyAdapter
#: from Samba 4.25; on an older Samba these checks skip (no per-record persistence)
BREAKS = frozenset({
    "persistent.restart", "persistent.plain-store", "persistent.wipe",
    "persistent.other-process",
})
