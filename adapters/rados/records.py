"""The rados adapter's record objects: what is where in them, and the
write ops that record locks, locked writes and a transaction's commit are
built of (``adapter.py`` sends them).

A database's objects are named in ``client.py`` (``record_oid``: by the
key's bucket). In a record object, omap key ``k<key>`` is a record and
``w<key>`` says that a process waits for the record's lock (``<key>``: the
Samba key, percent-encoded, ``client.encode_key``). A record's lock is
cls_lock ``client.lock_name(key)`` on its object, and ``TRANSACTION_LOCK``
a persistent database's transaction lock on its one object. The layout
and the ops' reasons: docs/adapters/rados.md.
"""

from __future__ import annotations

import rados

from dbwrap_py.adapters.rados import client as rc
from dbwrap_py.transactions import Writes

#: objects a volatile database spreads over, unless option ``objects`` says otherwise
DEFAULT_OBJECTS = 8
#: what one omap value may hold here (a 4 MiB value round-trips; the OSD's
#: osd_max_write_size is far above)
MAX_VALUE_SIZE = 4 * 1024 * 1024
#: a persistent database's transaction lock (cls_lock on its one object)
TRANSACTION_LOCK = "t"


def record_entry(name: str) -> str:
    """The omap key of the record whose encoded key is ``name``."""
    return "k" + name


def waiter_entry(name: str) -> str:
    """The omap key that flags a waiter for the lock of record ``name``."""
    return "w" + name


def lock(op: rados.WriteOp, name: str, token: int, seconds: float, flags: int = 0) -> None:
    """Take (or, with ``client.LOCK_MUST_RENEW``, renew) cls_lock ``name`` as ``token``."""
    op.execute("lock", "lock", rc.lock_op(name, f"{token:x}", seconds, flags))


def assert_locked(op: rados.WriteOp, name: str, token: int) -> None:
    """The op does nothing unless ``token`` holds an unexpired ``name``."""
    op.execute("lock", "assert_locked", rc.assert_op(name, f"{token:x}"))


def unlock(op: rados.WriteOp, name: str) -> None:
    """Let cls_lock ``name`` go, leaving nothing behind (``client.lock_xattr``)."""
    op.rm_xattr(rc.lock_xattr(name))


def write_record(io: rados.Ioctx, op: rados.WriteOp, name: str, value: bytes | None) -> None:
    """Set record ``name`` to ``value``; None removes it."""
    if value is None:
        io.remove_omap_keys(op, [record_entry(name)])
    else:
        io.set_omap(op, [record_entry(name)], [value])


def commit(io: rados.Ioctx, op: rados.WriteOp, token: int, writes: Writes) -> None:
    """A transaction's commit: every buffered write, and the transaction lock
    let go, in one op that does nothing unless ``token`` still holds it."""
    puts = [(record_entry(rc.encode_key(k)), v) for k, v in writes.items() if v is not None]
    deletes = [record_entry(rc.encode_key(k)) for k, v in writes.items() if v is None]
    assert_locked(op, TRANSACTION_LOCK, token)
    if puts:
        io.set_omap(op, [k for k, _ in puts], [v for _, v in puts])
    if deletes:
        io.remove_omap_keys(op, deletes)
    unlock(op, TRANSACTION_LOCK)
