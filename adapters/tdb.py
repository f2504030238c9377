"""Real tdb files, through Debian's python3-tdb and a little ctypes.

The files are ordinary tdb files (``tdbdump`` reads them) and tdb itself does
everything that has a tdb meaning: TDB_CLEAR_IF_FIRST, TDB_SEQNUM,
TDB_INCOMPATIBLE_HASH, TDB_MUTEX_LOCKING and the rest of ``tdb_flags`` are
passed to ``tdb_open`` unchanged, as are ``hash_size``, ``open_flags`` and
``mode``.

Record locks are tdb chainlocks, as in native dbwrap_tdb: fcntl locks (or
robust mutexes, with TDB_MUTEX_LOCKING) on the key's hash chain, so they
exclude other processes, nest within one process and vanish when the holder
dies. python3-tdb does not offer chainlocks, so the record operations (get,
put, lock, unlock, lock_get, put_unlock) come from our small C extension
(adapters/_tdb_records.c), given the ``struct tdb_context *`` read out of the
python3-tdb object. The adapter installs that object's bound methods as its
own, so the bridge calls libtdb with no Python frame in between: an SMB2 open
and close make about twenty such calls (make bench-bridge, bench-smb). That read depends on python3-tdb's object
layout (``PyObject_HEAD; TDB_CONTEXT *ctx; bool closed;``); it is checked
before use (object size, pointer size, and the pointer's ``tdb_name``,
``tdb_hash_size`` and ``tdb_get_flags`` must match what python3-tdb reports),
and the adapter refuses to open rather than guess.

One process may open one file only once (tdb_open fails with EBUSY), but
Samba opens some databases from several places. Like Samba's tdb_wrap, opens
of the same file (same st_dev/st_ino) in one process share one tdb handle,
counted; the first open's flags win, except that a later TDB_SEQNUM is
switched on and a later read-write open of a read-only handle is refused.

After fork the child reopens the handle (tdb_reopen), which gives the child
its own fd, its own fcntl locks and its own CLEAR_IF_FIRST "active" lock. If
the parent held a lock or a transaction at fork, tdb refuses to reopen (and
closes the inherited context); the child then opens the file afresh.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from collections.abc import Iterator

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
from dbwrap_py.options import Options

from . import _tdb_records

try:
    import tdb as _pytdb
except ImportError as _exc:  # the registry reports this as a ConfigError
    raise ImportError(f"the tdb adapter needs python3-tdb: {_exc}") from _exc

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
}
_LOCK_ERRORS = (TDB_ERR_LOCK, TDB_ERR_NOLOCK, TDB_ERR_LOCK_TIMEOUT)
#: what _tdb_records raises: by tdb error code, -1 once the adapter is closed
_RECORD_ERRORS = {**_ERROR_CLASSES, **{code: LockConflict for code in _LOCK_ERRORS}, -1: Unavailable}


class _Closed:
    """Stands in for the tdb object once the adapter is closed or broken,
    so a late call raises Unavailable instead of touching a stale handle."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        raise Unavailable(f"tdb adapter: {self._name} is closed")

    def __contains__(self, key: object) -> bool:
        raise Unavailable(f"tdb adapter: {self._name} is closed")


class _TdbDataOut(ctypes.Structure):
    """TDB_DATA as tdb hands it to a traverse callback: a raw pointer to copy from."""

    _fields_ = [("dptr", ctypes.c_void_p), ("dsize", ctypes.c_size_t)]


_TRAVERSE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, _TdbDataOut, _TdbDataOut, ctypes.c_void_p)


def _load_libtdb():
    # CDLL releases the GIL around a call, so a blocking chainlock or
    # transaction start does not stall the host's other Python threads.
    lib = ctypes.CDLL("libtdb.so.1")
    protos = {
        "tdb_transaction_start_nonblock": (ctypes.c_int, [ctypes.c_void_p]),
        "tdb_check": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        "tdb_traverse_read": (ctypes.c_int, [ctypes.c_void_p, _TRAVERSE_FN, ctypes.c_void_p]),
        "tdb_error": (ctypes.c_int, [ctypes.c_void_p]),
        "tdb_errorstr": (ctypes.c_char_p, [ctypes.c_void_p]),
        "tdb_name": (ctypes.c_char_p, [ctypes.c_void_p]),
        "tdb_fd": (ctypes.c_int, [ctypes.c_void_p]),
        "tdb_hash_size": (ctypes.c_int, [ctypes.c_void_p]),
        "tdb_get_flags": (ctypes.c_int, [ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib = _load_libtdb()

#: python3-tdb's PyTdbObject: PyObject_HEAD (16 bytes on 64-bit), then the context.
_CTX_OFFSET = 16
_CLOSED_OFFSET = 24
_EXPECTED_BASICSIZE = 32


def _context_of(db: "_pytdb.Tdb", path: str) -> int:
    """The ``struct tdb_context *`` inside a python3-tdb object, verified."""
    layout = f"python3-tdb object layout (basicsize {_pytdb.Tdb.__basicsize__})"
    if _pytdb.Tdb.__basicsize__ != _EXPECTED_BASICSIZE or sys.maxsize <= 2**32:
        raise ConfigError(
            f"tdb adapter: unexpected {layout} or 32-bit build; "
            "refusing to read the tdb context, so no chainlocks are possible"
        )
    ptr = ctypes.c_void_p.from_address(id(db) + _CTX_OFFSET).value
    closed = ctypes.c_bool.from_address(id(db) + _CLOSED_OFFSET).value
    if not ptr or ptr % 8 or closed:
        raise ConfigError(f"tdb adapter: {layout} holds no usable context for {path}")
    if (
        _lib.tdb_name(ptr) != db.filename
        or _lib.tdb_hash_size(ptr) != db.hash_size
        or _lib.tdb_get_flags(ptr) != db.flags
    ):
        raise ConfigError(
            f"tdb adapter: the context read from the {layout} does not match {path}; "
            "refusing to use it"
        )
    return ptr


def _tdb_error(exc: RuntimeError, what: str) -> Exception:
    """Turn python3-tdb's RuntimeError((code, text)) into a typed error."""
    args = exc.args
    if len(args) == 2 and isinstance(args[0], int):
        code, text = args
        if code == TDB_ERR_OOM:
            return MemoryError(f"{what}: {text}")
        cls = _ERROR_CLASSES.get(code, DbwrapError)
        return cls(f"{what}: {text} (tdb error {code})")
    return DbwrapError(f"{what}: {exc}")


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


class _Handle:
    """One open tdb file in this process, shared by all its adapters."""

    def __init__(self, spec: DatabaseSpec) -> None:
        self.spec = spec
        self.refs = 0
        self.key: tuple[int, int] | None = None
        self.pid = os.getpid()
        self.db = self._open()
        self.ctx = self._verified_context()
        self.ident = self._identity()

    @property
    def writable(self) -> bool:
        return self.spec.open_flags & os.O_ACCMODE != os.O_RDONLY

    def _open(self) -> "_pytdb.Tdb":
        spec = self.spec
        try:
            return _pytdb.Tdb(spec.name, spec.hash_size, spec.tdb_flags, spec.open_flags, spec.mode)
        except OSError as exc:
            raise _open_error(exc, spec) from exc
        except RuntimeError as exc:
            raise _tdb_error(exc, f"tdb_open({spec.name!r})") from exc

    def _verified_context(self) -> int:
        try:
            return _context_of(self.db, self.spec.name)
        except BaseException:
            self.db.close()
            raise

    def _identity(self) -> bytes | None:
        """st_dev and st_ino of the open file, as native dbwrap_tdb's db_id."""
        fd = _lib.tdb_fd(self.ctx)
        if fd < 0:  # TDB_INTERNAL
            return None
        st = os.fstat(fd)
        self.key = (st.st_dev, st.st_ino)
        return struct.pack("=QQ", st.st_dev, st.st_ino)

    def reopen_in_child(self) -> None:
        """Give this process its own fd, locks and CLEAR_IF_FIRST active lock."""
        if self.pid == os.getpid():
            return
        self.pid = os.getpid()
        self.ctx = 0
        try:
            self.db.reopen()
        except RuntimeError:
            # tdb refuses to reopen with the parent's locks or transaction
            # recorded in the context, and closes it; open the file afresh.
            self.db = self._open()
        self.ctx = _context_of(self.db, self.spec.name)

    def close(self) -> None:
        self.ctx = 0
        try:
            self.db.close()
        except RuntimeError:
            pass  # closed already (a failed reopen)


_handles: dict[tuple[int, int], _Handle] = {}


def _acquire(spec: DatabaseSpec) -> _Handle:
    handle = None
    if not spec.tdb_flags & TDB_INTERNAL:
        try:
            st = os.stat(spec.name)
        except OSError:
            pass
        else:
            handle = _handles.get((st.st_dev, st.st_ino))
    if handle is not None and handle.pid == os.getpid() and not handle.ctx:
        # broken by a failed reopen after fork: let this open try afresh
        del _handles[(st.st_dev, st.st_ino)]
        handle = None
    if handle is None:
        handle = _Handle(spec)
        if handle.key is not None:
            _handles[handle.key] = handle
    else:
        handle.reopen_in_child()  # in case no after_fork ran for it
        if spec.open_flags & os.O_ACCMODE != os.O_RDONLY and not handle.writable:
            raise AccessDenied(f"{spec.name} is open read-only in this process already")
        if spec.tdb_flags & TDB_SEQNUM and not handle.db.flags & TDB_SEQNUM:
            handle.db.enable_seqnum()
    handle.refs += 1
    return handle


def _release(handle: _Handle) -> None:
    handle.refs -= 1
    if handle.refs > 0:
        return
    if handle.key is not None and _handles.get(handle.key) is handle:
        del _handles[handle.key]
    handle.close()


class TdbAdapter(Adapter):
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
    option_names = ("native_records",)

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        if not spec.name:
            raise ConfigError("tdb adapter: no file name")
        self._handle: _Handle | None = _acquire(spec)
        self._records = _tdb_records.Records(0, _RECORD_ERRORS, DbwrapError)
        self._refresh()
        # The hot path in C: these bound methods replace the class's ones
        # below (which say the same in Python) for this instance.
        records = self._records
        self.get, self.put = records.get, records.put
        self.lock, self.unlock = records.lock, records.unlock
        self.lock_get, self.put_unlock = records.lock_get, records.put_unlock
        if options.get_bool("native_records", True):
            # the same operations for the bridge's hot path, without the GIL
            self.native_records = records.native_records

    def _refresh(self) -> None:
        handle = self._handle
        if handle is None or not handle.ctx:
            self._db = _Closed(self.spec.name)
            self._ctx = 0
        else:
            self._db = handle.db
            self._ctx = handle.ctx
        self._records.context = self._ctx  # reopened after fork, or 0: closed

    # -- records ----------------------------------------------------------

    # The record operations; __init__ installs their C versions on the instance.

    def get(self, key: bytes) -> bytes | None:
        return self._records.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._records.put(key, value)

    def lock(self, key: bytes) -> None:
        self._records.lock(key)

    def unlock(self, key: bytes) -> None:
        self._records.unlock(key)

    def try_lock(self, key: bytes) -> bool:
        """Take the record lock only if it is free (for the etcd node agent)."""
        return self._records.try_lock(key)

    def lock_get(self, key: bytes) -> bytes | None:
        return self._records.lock_get(key)

    def put_unlock(self, key: bytes, value: bytes) -> None:
        self._records.put_unlock(key, value)

    def exists(self, key: bytes) -> bool:
        try:
            return key in self._db
        except RuntimeError as exc:
            raise _tdb_error(exc, "tdb_exists") from exc

    def remove(self, key: bytes) -> bool:
        try:
            self._db.delete(key)
        except RuntimeError as exc:
            if exc.args and exc.args[0] == TDB_ERR_NOEXIST:
                return False
            raise _tdb_error(exc, "tdb_delete") from exc
        return True

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        # One tdb_traverse_read collects every record before the caller sees
        # the first. Not firstkey/nextkey: tdb keeps a fcntl read lock on the
        # record it stopped at until the walk reaches the end, so a traverse
        # the caller stops early would block other processes' transaction
        # commits and wipes (they lock the whole file) indefinitely.
        ctx = self._ctx
        if not ctx:
            raise Unavailable(f"tdb traverse: {self.spec.name} is closed")
        records: list[tuple[bytes, bytes]] = []
        failed: list[BaseException] = []
        append = records.append
        string_at = ctypes.string_at

        def collect(_tdb, key, value, _private):
            try:
                append(
                    (
                        string_at(key.dptr, key.dsize) if key.dsize else b"",
                        string_at(value.dptr, value.dsize) if value.dsize else b"",
                    )
                )
                return 0
            except BaseException as exc:  # MemoryError: stop, and raise it below
                failed.append(exc)
                return 1

        result = _lib.tdb_traverse_read(ctx, _TRAVERSE_FN(collect), None)
        if failed:
            raise failed[0]
        if result < 0:
            raise self._ctypes_error("tdb_traverse_read", Unavailable)
        return iter(records)

    def _ctypes_error(self, what: str, default: type[DbwrapError]) -> Exception:
        ctx = self._ctx
        if not ctx:
            return Unavailable(f"{what}: {self.spec.name} is closed")
        code = _lib.tdb_error(ctx)
        text = (_lib.tdb_errorstr(ctx) or b"").decode(errors="replace")
        message = f"{what} on {self.spec.name}: {text} (tdb error {code})"
        if code == TDB_ERR_OOM:
            return MemoryError(message)
        if code in _LOCK_ERRORS:
            return LockConflict(message)
        return _ERROR_CLASSES.get(code, default)(message)

    # -- database-wide ----------------------------------------------------

    def seqnum(self) -> int:
        return self._db.seqnum

    def transaction_start(self, nonblock: bool = False) -> None:
        if nonblock:
            ctx = self._ctx
            if not ctx or _lib.tdb_transaction_start_nonblock(ctx) != 0:
                raise self._ctypes_error("tdb_transaction_start_nonblock", LockConflict)
            return
        try:
            self._db.transaction_start()
        except RuntimeError as exc:
            raise _tdb_error(exc, "tdb_transaction_start") from exc

    def transaction_commit(self) -> None:
        try:
            self._db.transaction_commit()
        except RuntimeError as exc:
            raise _tdb_error(exc, "tdb_transaction_commit") from exc

    def transaction_cancel(self) -> None:
        try:
            self._db.transaction_cancel()
        except RuntimeError as exc:
            raise _tdb_error(exc, "tdb_transaction_cancel") from exc

    def wipe(self) -> None:
        try:
            self._db.clear()  # tdb_wipe_all
        except RuntimeError as exc:
            raise _tdb_error(exc, "tdb_wipe_all") from exc

    def check(self) -> None:
        if self.spec.tdb_flags & TDB_INTERNAL:
            return  # nothing on disk; tdb_check does not handle TDB_INTERNAL
        ctx = self._ctx
        if not ctx or _lib.tdb_check(ctx, None, None) != 0:
            raise self._ctypes_error("tdb_check", Corruption)

    def db_id(self) -> bytes:
        handle = self._handle
        if handle is None or handle.ident is None:
            return super().db_id()
        return handle.ident

    def after_fork(self) -> None:
        handle = self._handle
        if handle is None:
            return
        try:
            handle.reopen_in_child()
        finally:
            self._refresh()

    def close(self) -> None:
        handle, self._handle = self._handle, None
        self._refresh()
        if handle is not None:
            _release(handle)


ADAPTER = TdbAdapter
