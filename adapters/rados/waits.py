"""Waiting for a record lock in rados: a waiter watches the record's
object, flags itself (omap key ``w<key>``, ``records.waiter_entry``), tries
once more, and then sleeps until a notify, or at most ``MAX_WAIT_POLL``
seconds: a holder that died sends no notify, and its lock ends when the OSD
says so. The holder's unlock clears the flag and notifies the object
(``adapter.py``'s ``end_lease``). docs/adapters/rados.md, "Waiters".
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import rados

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados import records

#: the longest a waiter sleeps between tries without a notify
MAX_WAIT_POLL = 0.2


class Waits:
    """One database's watches on record objects, the wake-ups their notifies
    bring, and the keys this process flagged itself a waiter for."""

    def __init__(self, ops: rc.Ops) -> None:
        self.ops = ops
        self.cond = threading.Condition()
        self.generation: dict[str, int] = {}  # oid -> notifies seen
        self.watches: dict[str, object] = {}
        self.seen: dict[bytes, int] = {}  # key -> the oid's generation when we flagged it
        self.flagged: set[bytes] = set()  # keys whose wait flag we set since the last wake

    def on_notify(self, oid: str) -> None:
        with self.cond:
            self.generation[oid] = self.generation.get(oid, 0) + 1
            self.cond.notify_all()

    def wait_for_release(self, key: bytes, oid: str, pause: float) -> None:
        """Flag that we wait for ``key`` (its object ``oid`` watched) and
        return, for the caller to try again at once; once flagged, sleep
        until a notify or for ``pause``."""
        if key not in self.flagged:
            name = records.waiter_entry(rc.encode_key(key))
            self.seen[key] = self.generation.get(oid, 0)  # before the retry
            self.ops.write(oid, lambda op: self.ops.io.set_omap(op, [name], [b"1"]), "flag a waiter")
            self.flagged.add(key)
            return
        with self.cond:
            seen = self.seen.get(key, 0)
            self.cond.wait_for(lambda: self.generation.get(oid, 0) != seen, timeout=pause)
        self.flagged.discard(key)  # a wake-up cleared the flag; a timeout may have too

    def watch(self, oid: str, notified: Callable[..., object]) -> None:
        """Watch ``oid`` (once), ``notified`` called on its notifies: the
        caller's, who calls ``on_notify``. The adapter's refers back to it, so
        a dropped adapter with record watches is cyclic garbage, its watches
        (its opener's too) closed when the cycle collector runs."""
        if oid in self.watches:
            return
        with rc.translated("watch"):
            self.watches[oid] = self.ops.io.watch(oid, notified, timeout=30)

    def close(self) -> None:
        """Close the watches (in the process whose client made them)."""
        for watch in self.watches.values():
            try:
                watch.close()
            except rados.Error:
                pass  # the cluster drops a dead watch itself
        self.watches.clear()
