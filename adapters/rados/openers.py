"""TDB_CLEAR_IF_FIRST in rados: the store's side of a volatile database's
openers (``dbwrap_py.openers``, which owns the first-open test, the wipe's
order and the leave on close), on its meta object ``<prefix>/<db>``.

An open holds cls_lock ``open`` on the meta object (``exclusive``) while it
notifies it: no other opener's watch answering means nobody has the
database open (``others_open``); it reads the database's object count and
epoch from its xattrs and, the first opener, wipes it (``opened``). An
opener's registration is its own watch on the meta object (``register``).
A killed opener's watch lingers until the OSD times it out
(osd_client_watch_timeout, 30 s by default), so nothing is renewed (``ttl``
None). docs/adapters/rados.md, "TDB_CLEAR_IF_FIRST".
"""

from __future__ import annotations

import secrets
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados import records
from dbwrap_py.errors import Timeout
from dbwrap_py.retry import retry_until

if TYPE_CHECKING:
    from dbwrap_py.adapters.rados.adapter import RadosAdapter

#: how long an opener waits for other openers' watches to answer
OPENER_PING_MS = 500
#: the meta object's cls_lock while somebody opens the database
OPEN_LOCK = "open"


class RadosOpeners:
    """One volatile database's openers (a ``dbwrap_py.openers.OpenerStore``).
    Its adapter holds the registration, which holds this: the adapter is
    held weakly, since a strong reference back made a dropped adapter cyclic
    garbage, its opener's watch closed whenever the cycle collector ran
    (with the cluster gone: an unwatch that timed out), not when dropped."""

    ttl: float | None = None  # the OSD times a dead opener's watch out

    def __init__(self, db: RadosAdapter) -> None:
        self._db = weakref.ref(db)
        self.ops, self.meta_oid, self.op_timeout = db.ops, db.meta_oid, db.op_timeout
        self.watch: object | None = None

    def __repr__(self) -> str:
        return f"rados openers of {self.meta_oid}"

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """cls_lock ``open`` on the meta object, tried again until op_timeout,
        and let go at the end."""
        ops, oid, timeout, cookie = self.ops, self.meta_oid, self.op_timeout, secrets.randbits(63)
        for _ in retry_until(time.monotonic() + timeout):
            if ops.write(oid, lambda op: records.lock(op, OPEN_LOCK, cookie, timeout), "open") == 0:
                break
        else:
            raise Timeout(f"{oid}: another opener held the open lock past op_timeout")
        try:
            yield
        finally:
            ops.write(oid, lambda op: (records.assert_locked(op, OPEN_LOCK, cookie),
                                       records.unlock(op, OPEN_LOCK)), "open")

    def others_open(self) -> bool:
        """Notify the meta object: any answer, or a watcher that did not
        answer in time (it may be alive, or a dead opener's watch the OSD has
        not yet timed out), means another opener."""
        self.ops.round_trips += 1
        answers: list[tuple[int, list | None]] = []
        done = threading.Event()

        def finished(result: int, acks: list | None) -> None:
            answers.append((result, acks))
            done.set()

        self.ops.notify(self.meta_oid, "opener?", "find other openers", OPENER_PING_MS, finished)
        # Seen here: a notify whose completion never came, with other clients
        # busy on the object. No answer is taken as "maybe", which keeps the
        # records: a wipe is only for a database that is surely unused.
        if not done.wait(2 * OPENER_PING_MS / 1000):
            return True
        result, acks = answers[0]
        return result < 0 or bool(acks)

    def opened(self, first: bool) -> None:
        """The adapter's number of objects (xattr ``n``: the first opener's
        choice; a new database keeps the adapter's) and epoch (xattr ``e``:
        CLEAR_IF_FIRST wipes so far); ``first``: wipe, and the epoch one up."""
        db = self._db()
        assert db is not None, "called while its adapter opens"
        with rc.translated("open"):
            attrs = dict(self.ops.io.get_xattrs(self.meta_oid))
        self.ops.round_trips += 1
        if "n" in attrs:
            db.objects = int(attrs["n"])
        else:
            self._set("n", db.objects)
        db.epoch = int(attrs.get("e") or b"0")
        if first:
            db.wipe()
            db.epoch += 1
            self._set("e", db.epoch)

    def _set(self, xattr: str, value: int) -> None:
        self.ops.write(self.meta_oid, lambda op: op.set_xattr(xattr, b"%d" % value), "open")

    def register(self, opener: int) -> None:
        """This opener's watch on the meta object: it answers others' notifies."""
        with rc.translated("watch"):
            self.watch = self.ops.io.watch(self.meta_oid, lambda *args: b"open", timeout=30)

    def unregister(self, opener: int) -> None:
        if self.watch is not None:
            self.watch.close()  # a failure is logged (dbwrap_py.openers): the cluster drops it
            self.watch = None
