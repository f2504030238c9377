"""Real tdb files, through libtdb in the adapter's own C extension.

The files are ordinary tdb files (``tdbdump`` reads them) and tdb itself does
everything that has a tdb meaning: TDB_CLEAR_IF_FIRST, TDB_SEQNUM,
TDB_INCOMPATIBLE_HASH, TDB_MUTEX_LOCKING and the rest of ``tdb_flags`` are
passed to ``tdb_open`` unchanged, as are ``hash_size``, ``open_flags`` and
``mode``.

One way into tdb: the extension ``dbwrap_py.adapters.tdb._tdb`` (adapters/_tdb*.c)
opens the file and serves every operation.

* ``TdbFile`` is one open tdb: open, reopen after fork, close, traverse,
  transactions, seqnum, wipe, check, identity. The adapter's Python methods
  call it.
* ``TdbRecords`` is the C base class of ``TdbAdapter``: the record operations
  (get, put, lock, unlock, try_lock, lock_get, put_unlock, exists, remove) are
  its methods, so the class below is what runs, and the bridge calls libtdb
  with no Python frame in between (an SMB2 open and close make about twenty
  such calls). The same operations are offered to the bridge as native
  records (``native_records``), called without the GIL; option
  ``native_records = no`` withdraws them, to measure the Python path.

Record locks are tdb chainlocks, as in native dbwrap_tdb: fcntl locks (or
robust mutexes, with TDB_MUTEX_LOCKING) on the key's hash chain, so they
exclude other processes, nest within one process and vanish when the holder
dies.

Errors: ``_RECORD_ERRORS`` below maps tdb's error codes to dbwrap_py
exceptions; the extension raises those classes, and its native records
return their ``ntstatus``, so both paths answer alike.

One process may open one file only once (tdb_open fails with EBUSY), but
Samba opens some databases from several places. Like Samba's tdb_wrap, opens
of the same file (same st_dev/st_ino) in one process share one TdbFile,
counted; the first open's flags win, except that a later TDB_SEQNUM is
switched on and a later read-write open of a read-only handle is refused.

After fork the child reopens the file (tdb_reopen), which gives the child
its own fd, its own fcntl locks and its own CLEAR_IF_FIRST "active" lock. If
the parent held a lock or a transaction at fork, tdb refuses to reopen (and
frees the inherited context); the child then opens the file afresh. Either
way every open sharing the TdbFile uses the new context at once.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from functools import cache

from dbwrap_py.adapter import TDB_SEQNUM, Adapter, Capabilities, DatabaseSpec
from dbwrap_py.errors import (
    AccessDenied,
    ConfigError,
    Corruption,
    DbwrapError,
    InvalidParameter,
    LockConflict,
    NameCollision,
    NotFound,
    NotSupported,
    Unavailable,
)
from dbwrap_py.options import Option, Options

from ._tdb import TdbFile, TdbRecords, robust_mutexes

# enum TDB_ERROR (tdb.h)
TDB_ERR_CORRUPT = 1
TDB_ERR_IO = 2
TDB_ERR_LOCK = 3
TDB_ERR_OOM = 4
TDB_ERR_EXISTS = 5
TDB_ERR_NOLOCK = 6
TDB_ERR_LOCK_TIMEOUT = 7
TDB_ERR_NOEXIST = 8
TDB_ERR_EINVAL = 9
TDB_ERR_RDONLY = 10
TDB_ERR_NESTING = 11

TDB_INTERNAL = 2
#: not tdb's: the code for "the adapter, or its file, is closed"
TDB_CLOSED = -1

#: tdb error code -> the dbwrap_py exception the extension raises, and whose
#: ntstatus its native records return; TDB_ERR_OOM is MemoryError, any other
#: code DbwrapError
_ERROR_CLASSES: dict[int, type[DbwrapError]] = {
    TDB_ERR_CORRUPT: Corruption,
    TDB_ERR_IO: Unavailable,
    TDB_ERR_LOCK: LockConflict,
    TDB_ERR_EXISTS: NameCollision,
    TDB_ERR_NOLOCK: LockConflict,
    TDB_ERR_LOCK_TIMEOUT: LockConflict,
    TDB_ERR_NOEXIST: NotFound,
    TDB_ERR_EINVAL: InvalidParameter,
    TDB_ERR_RDONLY: AccessDenied,
    TDB_ERR_NESTING: NotSupported,
    TDB_CLOSED: Unavailable,
}


@cache
def mutexes_supported() -> bool:
    """Whether TDB_MUTEX_LOCKING works here (tdb's runtime check, asked once)."""
    return robust_mutexes()


def _open_error(exc: OSError, spec: DatabaseSpec) -> DbwrapError:
    cause = os.strerror(exc.errno) if exc.errno else str(exc)
    message = f"tdb_open({spec.name!r}) failed: {cause}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return AccessDenied(message)
    if exc.errno == errno.EINVAL:
        return ConfigError(f"{message} (tdb_flags={spec.tdb_flags:#x}, open_flags={spec.open_flags:#o})")
    if exc.errno == errno.EBUSY:
        return Unavailable(f"{message}: already open in this process under another name")
    return Unavailable(message)


def _open(spec: DatabaseSpec) -> TdbFile:
    try:
        return TdbFile(spec.name, spec.hash_size, spec.tdb_flags, spec.open_flags, spec.mode,
                       _ERROR_CLASSES, DbwrapError)
    except OSError as exc:
        raise _open_error(exc, spec) from exc


def _reopen_in_child(file: TdbFile, spec: DatabaseSpec) -> None:
    """Give this process its own fd and locks, if the file is its parent's."""
    try:
        file.reopen_in_child()
    except OSError as exc:  # tdb refused to reopen, and the fresh open failed
        raise _open_error(exc, spec) from exc


@dataclass
class _Shared:
    """One TdbFile, shared by this process's opens of its file."""

    file: TdbFile
    #: st_dev and st_ino, None for TDB_INTERNAL
    key: tuple[int, int] | None
    refs: int = 0

    @property
    def ident(self) -> bytes | None:
        """db_id: st_dev and st_ino, as native dbwrap_tdb's."""
        return None if self.key is None else struct.pack("=QQ", *self.key)


_shared: dict[tuple[int, int], _Shared] = {}


def _find(spec: DatabaseSpec) -> _Shared | None:
    """The file this process has open already under spec's name, if usable."""
    if spec.tdb_flags & TDB_INTERNAL:
        return None
    try:
        st = os.stat(spec.name)
    except OSError:
        return None
    shared = _shared.get((st.st_dev, st.st_ino))
    if shared is None:
        return None
    try:
        _reopen_in_child(shared.file, spec)  # in case no after_fork ran for it
    except DbwrapError:
        pass
    if shared.file.closed:  # lost in a failed reopen: this open tries afresh
        del _shared[(st.st_dev, st.st_ino)]
        return None
    return shared


def _acquire(spec: DatabaseSpec) -> _Shared:
    shared = _find(spec)
    if shared is None:
        file = _open(spec)
        shared = _Shared(file, file.identity())
        if shared.key is not None:
            _shared[shared.key] = shared
    else:
        if spec.open_flags & os.O_ACCMODE != os.O_RDONLY and not shared.file.writable:
            raise AccessDenied(f"{spec.name} is open read-only in this process already")
        if spec.tdb_flags & TDB_SEQNUM and not shared.file.flags & TDB_SEQNUM:
            shared.file.enable_seqnum()
    shared.refs += 1
    return shared


def _release(shared: _Shared) -> None:
    shared.refs -= 1
    if shared.refs > 0:
        return
    if shared.key is not None and _shared.get(shared.key) is shared:
        del _shared[shared.key]
    shared.file.close()


class TdbAdapter(TdbRecords, Adapter):
    """get, put, lock, unlock, try_lock, lock_get, put_unlock, exists and
    remove are TdbRecords' (C); the rest is here, on ``self.tdb_file``."""

    capabilities = Capabilities(
        transactions=True,
        multi_process=True,
        lock_release_seconds=0.0,
        notes=(
            "record locks are tdb chainlocks: keys in one hash chain share a lock, as in native tdb",
            "opens of one file in one process share a handle; the first open's flags win",
        ),
    )
    #: native_records=no keeps the bridge on the Python methods (to measure them)
    options_schema = (Option("native_records", bool, True, help="no: keep the bridge on the Python methods"),)

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        if not spec.name:
            raise ConfigError("tdb adapter: no file name")
        self._native = options.value("native_records")
        self._shared: _Shared | None = _acquire(spec)
        self.tdb_file = self._shared.file

    @property
    def native_records(self) -> object | None:
        """The record operations for the bridge's hot path, without the GIL
        (a capsule, c_core/native_records.h); None with native_records=no."""
        return self.native_capsule() if self._native else None

    def _file(self) -> TdbFile:
        file = self.tdb_file
        if file is None:
            raise Unavailable(f"tdb adapter: {self.spec.name} is closed")
        return file

    # -- database-wide ----------------------------------------------------

    def scan(self) -> list[tuple[bytes, bytes]]:
        # one tdb_traverse_read, collected before the caller sees a record:
        # adapters/tdb/_tdb_file.c (file_scan) says why
        return self._file().scan()

    def seqnum(self) -> int:
        return self._file().seqnum()

    def transaction_start(self, nonblock: bool = False) -> None:
        self._file().transaction_start(nonblock)

    def transaction_commit(self) -> None:
        self._file().transaction_commit()

    def transaction_cancel(self) -> None:
        self._file().transaction_cancel()

    def wipe(self) -> None:
        self._file().wipe()

    def check(self) -> None:
        self._file().check()

    def db_id(self) -> bytes:
        shared = self._shared
        if shared is None or shared.ident is None:
            return super().db_id()
        return shared.ident

    def after_fork(self) -> None:
        if self._shared is not None:
            _reopen_in_child(self._shared.file, self.spec)

    def close(self) -> None:
        shared, self._shared = self._shared, None
        self.tdb_file = None
        if shared is not None:
            _release(shared)


ADAPTER = TdbAdapter
