"""Broken on purpose: every operation raises. The bridge must turn each into
an NTSTATUS and one log line, and the suite must fail every check that
reaches the adapter."""

from __future__ import annotations

from collections.abc import Iterable

from dbwrap_py.adapter import Adapter


class Broken(RuntimeError):
    pass


class RaisingAdapter(Adapter):
    def get(self, key: bytes) -> bytes | None:
        raise Broken("get, broken on purpose")

    def put(self, key: bytes, value: bytes) -> None:
        raise Broken("put, broken on purpose")

    def remove(self, key: bytes) -> bool:
        raise Broken("remove, broken on purpose")

    def scan(self) -> Iterable[tuple[bytes, bytes]]:
        raise Broken("scan, broken on purpose")

    def lock(self, key: bytes) -> None:
        raise Broken("lock, broken on purpose")

    def unlock(self, key: bytes) -> None:
        raise Broken("unlock, broken on purpose")

    def seqnum(self) -> int:
        raise Broken("seqnum, broken on purpose")

    def check(self) -> None:
        raise Broken("check, broken on purpose")

    def wipe(self) -> None:
        raise Broken("wipe, broken on purpose")


ADAPTER = RaisingAdapter
# Every check fails but two that never reach it: dbwrap itself refuses
# transactions on volatile databases, and a failing db_id falls back to the
# database's name, which is stable and distinct by design.
BREAKS = frozenset({
    "kv.binary-keys", "kv.values", "kv.storev", "kv.store-flags", "kv.missing",
    "traverse.counts", "traverse.read-only", "traverse.delete-all", "traverse.early-stop",
    "db.seqnum", "db.wipe", "db.check", "db.fork",
    "lock.counter", "lock.counters", "lock.mixed", "lock.own-writes", "lock.handed-value",
    "lock.release-on-free", "lock.release-on-kill", "lock.fencing", "history.linearizability",
    # Samba 4.25 on (before, these skip): the open's restore already fails
    "persistent.restart", "persistent.plain-store", "persistent.wipe", "persistent.other-process",
})
