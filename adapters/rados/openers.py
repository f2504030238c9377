"""TDB_CLEAR_IF_FIRST in rados: a volatile database's openers, on its meta
object ``<prefix>/<db>``.

An opener takes cls_lock ``open`` on the meta object (``open_lock``), reads
the database's object count and epoch from its xattrs (``read_meta``),
notifies it, and wipes the database if no other opener's watch answers
(``others_open``); then it watches the meta object itself (``watch``). A
killed opener's watch lingers until the OSD times it out
(osd_client_watch_timeout, 30 s by default). ``adapter.py`` runs these in
that order; docs/adapters/rados.md, "TDB_CLEAR_IF_FIRST".
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.adapters.rados import records
from dbwrap_py.errors import Timeout
from dbwrap_py.retry import retry_until

#: how long an opener waits for other openers' watches to answer
OPENER_PING_MS = 500
#: the meta object's cls_lock while somebody opens the database
OPEN_LOCK = "open"


@contextmanager
def open_lock(ops: rc.Ops, meta_oid: str, op_timeout: float) -> Iterator[None]:
    """cls_lock ``open`` on the meta object, tried again until op_timeout,
    and let go at the end."""
    cookie = secrets.randbits(63)
    for _ in retry_until(time.monotonic() + op_timeout):
        if ops.write(meta_oid, lambda op: records.lock(op, OPEN_LOCK, cookie, op_timeout), "open") == 0:
            break
    else:
        raise Timeout(f"{meta_oid}: another opener held the open lock past op_timeout")
    try:
        yield
    finally:
        ops.write(meta_oid, lambda op: (records.assert_locked(op, OPEN_LOCK, cookie),
                                        records.unlock(op, OPEN_LOCK)), "open")


def read_meta(ops: rc.Ops, meta_oid: str, objects: int) -> tuple[int, int]:
    """The number of objects the database has (the first opener's choice:
    xattr ``n``; a new database gets ``objects``), and its epoch (xattr
    ``e``: CLEAR_IF_FIRST wipes so far)."""
    with rc.translated("open"):
        attrs = dict(ops.io.get_xattrs(meta_oid))
    ops.round_trips += 1
    if "n" in attrs:
        objects = int(attrs["n"])
    else:
        ops.write(meta_oid, lambda op: op.set_xattr("n", b"%d" % objects), "open")
    return objects, int(attrs.get("e") or b"0")


def next_epoch(ops: rc.Ops, meta_oid: str, epoch: int) -> int:
    """After a wipe: the epoch one up, kept on the meta object."""
    epoch += 1
    ops.write(meta_oid, lambda op: op.set_xattr("e", b"%d" % epoch), "open")
    return epoch


def others_open(ops: rc.Ops, meta_oid: str) -> bool:
    """Notify the meta object: any answer, or a watcher that did not
    answer in time (it may be alive, or a dead opener's watch the OSD has
    not yet timed out), means another opener."""
    ops.round_trips += 1
    answers: list[tuple[int, list | None]] = []
    done = threading.Event()

    def finished(result: int, acks: list | None) -> None:
        answers.append((result, acks))
        done.set()

    ops.notify(meta_oid, "opener?", "find other openers", OPENER_PING_MS, finished)
    # Seen here: a notify whose completion never came, with other clients
    # busy on the object. No answer is taken as "maybe", which keeps the
    # records: a wipe is only for a database that is surely unused.
    if not done.wait(2 * OPENER_PING_MS / 1000):
        return True
    result, acks = answers[0]
    return result < 0 or bool(acks)


def watch(ops: rc.Ops, meta_oid: str) -> object:
    """This opener's watch on the meta object: it answers others' notifies."""
    with rc.translated("watch"):
        return ops.io.watch(meta_oid, lambda *args: b"open", timeout=30)
