"""Traverses, the half of a connection's requests that walks a database.

A read traverse streams the adapter's scan. A write traverse walks a
snapshot of the keys and locks each record it returns for the connection
(through the database's RecordLocks, parking when another connection has
it) until the next TRAVERSE_NEXT or TRAVERSE_END; records gone meanwhile are
skipped. Session mixes this in; the record helpers it uses are Session's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dbwrap_py.proxy import wire
from dbwrap_py.proxy.ids import next_id
from dbwrap_py.proxy.locks import Outcome
from dbwrap_py.proxy.shared import SharedDatabase
from dbwrap_py.proxy.wire import Malformed, Reader

if TYPE_CHECKING:
    from dbwrap_py.proxy.session import Session

Reply = bytes | None


@dataclass(eq=False)
class Traverse:
    shared: SharedDatabase
    write: bool
    records: Iterator[tuple[bytes, bytes]] | None = None  # read traverse
    keys: list[bytes] = field(default_factory=list)         # write traverse, reversed
    current: bytes | None = None                            # write traverse's locked record


class TraverseRequests:
    """TRAVERSE_START, TRAVERSE_NEXT and TRAVERSE_END of a Session."""

    def _traverse_start(self: "Session", shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        write = r.u8()
        r.end()
        if write > 1:
            raise Malformed(f"TRAVERSE_START's write is {write}, not 0 or 1")
        traverse = Traverse(shared, bool(write))
        if write:
            ok, result = self._adapter(shared, "TRAVERSE_START",
                                       lambda db: [key for key, _ in db.traverse(False)][::-1])
            traverse.keys = result  # type: ignore[assignment]
        else:
            ok, result = self._adapter(shared, "TRAVERSE_START", lambda db: db.traverse(False))
            traverse.records = result  # type: ignore[assignment]
        if not ok:
            return result  # type: ignore[return-value]
        self._last_traverse = next_id(self._traverses, self._last_traverse)
        self._traverses[self._last_traverse] = traverse
        return wire.reply_ok().u32(self._last_traverse).message()

    def _traverse(self: "Session", r: Reader) -> tuple[int, Traverse]:
        number = r.u32()
        r.end()
        traverse = self._traverses.get(number)
        if traverse is None:
            raise Malformed(f"unknown traverse {number}")
        return number, traverse

    def _traverse_next(self: "Session", shared: SharedDatabase, handle: int, r: Reader) -> Reply:
        number, traverse = self._traverse(r)
        if traverse.shared is not shared:
            raise Malformed(f"traverse {number} belongs to another database")
        self._end_current(traverse)
        if not traverse.write:
            return self._read_step(number, traverse)
        return self._write_step(number, traverse)

    def _read_step(self: "Session", number: int, traverse: Traverse) -> bytes:
        assert traverse.records is not None
        records = traverse.records
        ok, result = self._adapter(traverse.shared, "TRAVERSE_NEXT", lambda db: next(records, None))
        if not ok or result is None:
            del self._traverses[number]
            return result if not ok else wire.reply_ok().u8(0).message()  # type: ignore[return-value]
        key, value = result  # type: ignore[misc]
        return wire.reply_ok().u8(1).bytes(key).bytes(value).message()

    def _write_step(self: "Session", number: int, traverse: Traverse) -> Reply:
        """Lock the next record still there; park when another connection has it."""
        shared = traverse.shared
        while traverse.keys:
            key = traverse.keys.pop()
            outcome = shared.locks.acquire(
                self, key,
                granted=lambda k=key: self.later(lambda: self._traverse_granted(number, traverse, k)),
                expired=lambda: None, deadline=None)
            if outcome is Outcome.PARKED:
                return None
            reply = self._write_record(number, traverse, key)
            if reply is not None:
                return reply
        del self._traverses[number]
        return wire.reply_ok().u8(0).message()

    def _traverse_granted(self: "Session", number: int, traverse: Traverse, key: bytes) -> None:
        if self.closed or self._traverses.get(number) is not traverse:
            traverse.shared.locks.release(self, key, every_hold=True)
            return
        reply = self._write_record(number, traverse, key) or self._write_step(number, traverse)
        if reply is not None:
            self._send(reply, False)

    def _write_record(self: "Session", number: int, traverse: Traverse, key: bytes) -> bytes | None:
        """The reply with ``key`` (held now), or None when it is gone."""
        ok, value = self._take_record(traverse.shared, key, "TRAVERSE_NEXT")
        if not ok:
            del self._traverses[number]
            return value
        if value is None:
            self._release(traverse.shared, key)
            return None
        traverse.current = key
        return wire.reply_ok().u8(1).bytes(key).bytes(value).message()

    def _end_current(self: "Session", traverse: Traverse) -> None:
        if traverse.current is not None:
            key, traverse.current = traverse.current, None
            self._release(traverse.shared, key)

    def _traverse_end(self: "Session", shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        number, traverse = self._traverse(r)
        self._end_current(traverse)
        del self._traverses[number]
        return wire.reply_ok().message()
