"""One connection's state and its requests.

Everything here runs on the daemon's one thread, a task at a time (posted
with ``later``), so the state needs no lock. A request either replies at once or parks (on a
record lock or a transaction gate) and replies from the task its wake-up
queues. ``hang_up`` (malformed input, or the socket closed) lets go of all
the connection holds: this is how a crashed smbd process's locks are freed.

Record holds: the database's RecordLocks says which connection holds what;
the adapter's own lock (Database.lock) is taken with a connection's first
hold of a record and given back with its last, as ``_adapter_held`` notes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dbwrap_py import ntstatus as nt
from dbwrap_py.database import Database
from dbwrap_py.errors import DbwrapError, ntstatus_of
from dbwrap_py.nodecache.adapter import write_back_cache
from dbwrap_py.nodecache.cache import local_files
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.locks import Outcome, deadline_of
from dbwrap_py.proxy.ids import next_id
from dbwrap_py.proxy.log import log
from dbwrap_py.proxy.policy import DaemonConfig
from dbwrap_py.proxy.shared import DatabaseTable, SharedDatabase
from dbwrap_py.proxy.traverse import Traverse, TraverseRequests
from dbwrap_py.proxy.wire import Malformed, Op, Reader, Txn

TDB_REPLACE = 1
#: requests that only let go of something pass another connection's
#: transaction gate, so the transaction's owner is not left waiting for a
#: record held by a connection parked at its gate. UNLOCK with a value
#: writes, so it stops at the gate after all (in _unlock); TRANSACTION
#: handles the gate itself (START_NONBLOCK must not wait).
_PASS_THE_GATE = {Op.CLOSE, Op.TRAVERSE_END, Op.UNLOCK, Op.TRANSACTION}

Reply = bytes | None  # None: parked, the reply comes later
Send = Callable[[bytes | None, bool], None]  # (message, then hang up)
Later = Callable[[Callable[[], None]], None]  # run a task on the daemon's thread, in order


def _simple(op: Op, call: Callable[[Database], object]) -> Callable[..., bytes]:
    """The handler of an op with no fields either way."""
    def handler(self: "Session", shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        r.end()
        ok, result = self._adapter(shared, op.name, call)
        return wire.reply_ok().message() if ok else result  # type: ignore[return-value]
    return handler


def _node_cache_reply(db: Database) -> bytes:
    """NODE_CACHE's reply: where smbd finds the files of the database's node
    cache (absolute: smbd's working directory is not ours)."""
    cache = write_back_cache(db.adapter)
    records, buckets = local_files(cache.cache_dir.absolute(), cache.db_id)
    return (wire.reply_ok().str(str(records)).str(str(buckets)).str(str(cache.cache_dir.absolute()))
            .bytes(cache.db_id).u64(cache.wipe_revision).u32(round(cache.op_timeout * 1000)).message())


class Session(TraverseRequests):
    """The daemon's side of one connection (one smbd process)."""

    def __init__(self, table: DatabaseTable, later: Later, send: Send,
                 config: DaemonConfig | None = None) -> None:
        self.table = table
        #: what peers may open (None: root's daemon, no --config; policy.py)
        self.config = config
        self.later = later
        self._send = send
        self.peer_pid = 0
        self.closed = False
        self._greeted = False
        self._version = 0  # agreed by HELLO
        self._handles: dict[int, SharedDatabase] = {}
        self._traverses: dict[int, Traverse] = {}
        self._txn_depth: dict[SharedDatabase, int] = {}
        self._adapter_held: set[tuple[SharedDatabase, bytes]] = set()
        self._last_handle = self._last_traverse = 0
        self._body = b""  # the request being handled, to run again after a gate
        self._parked_at: float | None = None  # when a LOCK parked, for the metrics

    # -- entry points (each a task posted with later) ----------------------------

    def request(self, body: bytes) -> None:
        if self.closed:
            return
        try:
            reply = self._dispatch(body)
        except Malformed as exc:
            self.hang_up(f"malformed request: {exc}")
            return
        except Exception as exc:  # a bug of ours: this connection ends, the daemon does not
            self.hang_up(f"internal error: {type(exc).__name__}: {exc}")
            return
        if reply is not None:
            self._send(reply, False)

    def hang_up(self, reason: str | None) -> None:
        """Let go of everything (the connection is gone or broke the protocol)."""
        if self.closed:
            return
        if reason is not None:
            log(f"pid {self.peer_pid}: {reason}; closing its connection")
        self.closed = True
        self._waited()  # a parked LOCK ends with its connection
        self._send(None, True)
        for shared in set(self._handles.values()):
            shared.forget(self)
            self._let_go(shared)
        for shared in self._handles.values():
            self.table.release(shared)
        self._handles.clear()

    # -- dispatch ---------------------------------------------------------------

    def _dispatch(self, body: bytes) -> Reply:
        r = Reader(body)
        raw_op, pad8, pad16, handle = r.u8(), r.u8(), r.u16(), r.u32()
        if pad8 or pad16:
            raise Malformed("non-zero padding in the request header")
        try:
            op = Op(raw_op)
        except ValueError:
            raise Malformed(f"unknown op {raw_op}") from None
        if not self._greeted:
            if op is not Op.HELLO:
                raise Malformed(f"{op.name} before HELLO")
            return self._hello(r)
        if op is Op.HELLO:
            raise Malformed("a second HELLO")
        if self._version < wire.OP_VERSION.get(op, wire.MIN_VERSION):
            raise Malformed(f"{op.name} on a version {self._version} connection")
        if op is Op.OPEN:
            return self._open(r)
        shared = self._handles.get(handle)
        if shared is None:
            raise Malformed(f"{op.name} on unknown database handle {handle}")
        self._body = body
        if op not in _PASS_THE_GATE and not self._enter(shared):
            return None
        return _HANDLERS[op](self, shared, handle, r)

    def _enter(self, shared: SharedDatabase) -> bool:
        """Past the transaction gate, or parked to run this request again."""
        body = self._body
        return shared.enter(self, lambda: self.later(lambda: self.request(body)))

    def _failed(self, shared: SharedDatabase, op: str, exc: Exception) -> bytes:
        cause = f"{type(exc).__name__}: {exc}"
        if not (isinstance(exc, DbwrapError) and exc.routine):
            log(f"pid {self.peer_pid}: {shared.name}: {op}: {cause}")
        return wire.reply_error(ntstatus_of(exc), cause)

    def _adapter(self, shared: SharedDatabase, op: str,
                 fn: Callable[[Database], object]) -> tuple[bool, object]:
        """(True, result) of an adapter call, or (False, its error reply)."""
        calls = self.table.stats.adapter_calls
        calls[op] = calls.get(op, 0) + 1
        try:
            return True, shared.call(fn, shared.db)
        except Exception as exc:
            return False, self._failed(shared, op, exc)

    # -- HELLO and OPEN -----------------------------------------------------------

    def _hello(self, r: Reader) -> Reply:
        magic, low, high, pid = r.u32(), r.u16(), r.u16(), r.u32()
        r.end()
        if magic != wire.MAGIC:
            raise Malformed(f"bad magic 0x{magic:08x}")
        self.peer_pid = self.peer_pid or pid  # the kernel's (SO_PEERCRED) when there is one
        version = min(high, wire.VERSION)
        if low > high or version < max(low, wire.MIN_VERSION):
            log(f"pid {pid}: speaks versions {low}-{high}, we {wire.MIN_VERSION}-{wire.VERSION}; closing")
            self._send(wire.reply_error(nt.NT_STATUS_NOT_SUPPORTED,
                                        f"versions {low}-{high} asked, {wire.MIN_VERSION}-"
                                        f"{wire.VERSION} spoken"), True)
            self.hang_up(None)
            return None  # sent already
        self._greeted = True
        self._version = version
        return wire.reply_ok().u16(version).u32(wire.MAX_MESSAGE).message()

    def _open(self, r: Reader) -> bytes:
        name, hash_size, tdb_flags, open_flags = r.str(), r.i32(), r.i32(), r.i32()
        mode, lock_order, dbwrap_flags, adapter = r.u32(), r.i32(), r.u64(), r.str()
        options = [r.str() for _ in range(r.u32())]
        r.end()
        try:
            if self.config is not None:  # the daemon's configuration decides, not the peer
                admitted = self.config.admit(name, open_flags, mode, adapter, options)
                name, open_flags, mode, adapter, options = (admitted.name, admitted.open_flags, admitted.mode,
                                                            admitted.adapter, admitted.options)
            shared = self.table.open(name, hash_size, tdb_flags, open_flags, mode, lock_order,
                                     dbwrap_flags, adapter, options)
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            log(f"pid {self.peer_pid}: {name}: OPEN ({adapter}): {cause}")
            return wire.reply_error(ntstatus_of(exc), cause)
        self._last_handle = next_id(self._handles, self._last_handle)
        self._handles[self._last_handle] = shared
        return wire.reply_ok().u32(self._last_handle).message()

    def _close(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        r.end()
        del self._handles[handle]
        if shared not in self._handles.values():
            self._let_go(shared)
        self.table.release(shared)
        return wire.reply_ok().message()

    def _let_go(self, shared: SharedDatabase) -> None:
        """This connection's traverses, record holds and transaction on ``shared`` end."""
        for number in [n for n, t in self._traverses.items() if t.shared is shared]:
            del self._traverses[number]
        for key in shared.locks.held_by(self):
            self._release(shared, key, every_hold=True)
        depth = self._txn_depth.pop(shared, 0)
        for _ in range(depth):  # a failure is logged; the gate opens regardless
            self._adapter(shared, "TRANSACTION cancel", lambda db: db.transaction_cancel())
        if depth:
            shared.open_gate(self)

    # -- records --------------------------------------------------------------------

    def _fetch(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key = r.bytes()
        r.end()
        ok, result = self._adapter(shared, "FETCH", lambda db: db.fetch(key))
        return wire.reply_ok().opt(result).message() if ok else result  # type: ignore[arg-type,return-value]

    def _exists(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key = r.bytes()
        r.end()
        ok, result = self._adapter(shared, "EXISTS", lambda db: db.exists(key))
        return wire.reply_ok().u8(int(bool(result))).message() if ok else result  # type: ignore[return-value]

    def _lock(self, shared: SharedDatabase, handle: int, r: Reader) -> Reply:
        key, wait_ms = r.bytes(), r.u32()
        r.end()
        outcome = shared.locks.acquire(
            self, key,
            granted=lambda: self.later(lambda: self._lock_granted(shared, key)),
            expired=lambda: self.later(lambda: self._lock_expired(key, wait_ms)),
            deadline=deadline_of(wait_ms))
        if outcome is Outcome.BUSY:
            return wire.reply_error(nt.NT_STATUS_IO_TIMEOUT, "the record is locked by another connection")
        if outcome is Outcome.PARKED:
            self._parked_at = time.monotonic()
            self.table.stats.lock_waits += 1
            return None
        return self._locked_value(shared, key)

    def _waited(self) -> None:
        """A parked LOCK ends (granted or timed out): its wait is counted."""
        if self._parked_at is not None:
            self.table.stats.lock_wait_seconds += time.monotonic() - self._parked_at
            self._parked_at = None

    def _lock_granted(self, shared: SharedDatabase, key: bytes) -> None:
        self._waited()
        if self.closed:  # gone while parked: the hold it was just given goes too
            shared.locks.release(self, key, every_hold=True)
            return
        self._send(self._locked_value(shared, key), False)

    def _lock_expired(self, key: bytes, wait_ms: int) -> None:
        self._waited()
        if not self.closed:
            self._send(wire.reply_error(nt.NT_STATUS_IO_TIMEOUT,
                                        f"the record stayed locked by another connection for {wait_ms} ms"),
                       False)

    def _locked_value(self, shared: SharedDatabase, key: bytes) -> bytes:
        """The reply to a granted LOCK."""
        ok, value = self._take_record(shared, key, "LOCK")
        return wire.reply_ok().opt(value).message() if ok else value  # type: ignore[return-value]

    def _take_record(self, shared: SharedDatabase, key: bytes, op: str) -> tuple[bool, bytes | None]:
        """(True, value) of a record just held here, the first hold taking the
        adapter's lock too; (False, an error reply) when that fails, unheld."""
        first = (shared, key) not in self._adapter_held
        read = (lambda db: db.lock(key)) if first else (lambda db: db.fetch(key))
        ok, value = self._adapter(shared, op, read)
        if not ok:
            shared.locks.release(self, key)
        elif first:
            self._adapter_held.add((shared, key))
        return ok, value  # type: ignore[return-value]

    def _release(self, shared: SharedDatabase, key: bytes, value: bytes | None = None,
                 every_hold: bool = False) -> bytes | None:
        """One hold (or all) of ``key`` goes; the last gives back the adapter's
        lock first, storing ``value`` on the way. An error reply, or None."""
        failure = None
        last = every_hold or shared.locks.holds(self, key) == 1
        if last and (shared, key) in self._adapter_held:
            self._adapter_held.discard((shared, key))
            ok, failure = self._adapter(shared, "UNLOCK", lambda db: db.unlock(key, value))
        elif value is not None:
            ok, failure = self._adapter(shared, "UNLOCK", lambda db: db.store(key, value, TDB_REPLACE))
        shared.locks.release(self, key, every_hold)
        return failure  # type: ignore[return-value]

    def _unlock(self, shared: SharedDatabase, handle: int, r: Reader) -> Reply:
        key, value = r.bytes(), r.opt()
        r.end()
        if value is not None and not self._enter(shared):
            return None  # it writes: not inside another connection's transaction
        if not shared.locks.holds(self, key):
            return wire.reply_error(nt.NT_STATUS_NOT_FOUND,
                                    "UNLOCK of a record this connection does not hold")
        return self._release(shared, key, value) or wire.reply_ok().message()

    def _not_held(self, shared: SharedDatabase, key: bytes, op: str) -> bytes | None:
        if shared.locks.holds(self, key):
            return None
        return wire.reply_error(nt.NT_STATUS_FILE_LOCK_CONFLICT,
                                f"{op} of a record this connection has not locked")

    def _store(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key, flag, value = r.bytes(), r.i32(), r.bytes()
        r.end()
        refused = self._not_held(shared, key, "STORE")
        if refused:
            return refused
        ok, result = self._adapter(shared, "STORE", lambda db: db.store(key, value, flag))
        return wire.reply_ok().message() if ok else result  # type: ignore[return-value]

    def _delete(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key = r.bytes()
        r.end()
        refused = self._not_held(shared, key, "DELETE")
        if refused:
            return refused
        ok, result = self._adapter(shared, "DELETE", lambda db: db.delete(key))
        return wire.reply_ok().message() if ok else result  # type: ignore[return-value]

    def _write_through(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key = r.bytes()
        r.end()
        refused = self._not_held(shared, key, "WRITE_THROUGH")
        if refused:
            return refused
        ok, result = self._adapter(shared, "WRITE_THROUGH", lambda db: db.write_through(key))
        return wire.reply_ok().message() if ok else result  # type: ignore[return-value]

    # -- database-wide --------------------------------------------------------------

    def _seqnum(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        r.end()
        ok, result = self._adapter(shared, "SEQNUM", lambda db: db.seqnum())
        return wire.reply_ok().i32(result).message() if ok else result  # type: ignore[arg-type,return-value]

    _wipe = _simple(Op.WIPE, lambda db: db.wipe())
    _check = _simple(Op.CHECK, lambda db: db.check())

    def _db_id(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        r.end()
        ok, result = self._adapter(shared, "DB_ID", lambda db: db.db_id())
        if not ok:
            return result  # type: ignore[return-value]
        return wire.reply_ok().bytes(result).message()  # type: ignore[arg-type]

    # -- smbd's fast path: owned records in the process, the rest here --------------

    def _node_cache(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        r.end()
        return self._adapter(shared, "NODE_CACHE", _node_cache_reply)[1]  # type: ignore[return-value]

    def _move_in(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key = r.bytes()
        r.end()
        ok, result = self._adapter(shared, "MOVE_IN", lambda db: write_back_cache(db.adapter).move_in(key))
        return wire.reply_ok().u8(int(bool(result))).message() if ok else result  # type: ignore[return-value]

    def _hand_over(self, shared: SharedDatabase, handle: int, r: Reader) -> bytes:
        key = r.bytes()
        r.end()
        ok, result = self._adapter(shared, "HAND_OVER",
                                   lambda db: write_back_cache(db.adapter).hand_over_if_free(key))
        return wire.reply_ok().message() if ok else result  # type: ignore[return-value]

    # -- transactions ---------------------------------------------------------------

    def _transaction(self, shared: SharedDatabase, handle: int, r: Reader) -> Reply:
        raw = r.u8()
        r.end()
        try:
            what = Txn(raw)
        except ValueError:
            raise Malformed(f"unknown transaction request {raw}") from None
        if what in (Txn.START, Txn.START_NONBLOCK):
            return self._txn_start(shared, what is Txn.START_NONBLOCK)
        return self._txn_end(shared, what is Txn.COMMIT)

    def _txn_start(self, shared: SharedDatabase, nonblock: bool) -> Reply:
        resume = lambda: self.later(lambda: self._resume_txn_start(shared))  # noqa: E731
        outcome = shared.take(self, resume, nonblock)
        if outcome is Outcome.BUSY:
            return wire.reply_error(nt.NT_STATUS_FILE_LOCK_CONFLICT,
                                    "another connection has a transaction on this database")
        if outcome is Outcome.PARKED:
            return None
        ok, result = self._adapter(shared, "TRANSACTION start", lambda db: db.transaction_start(nonblock))
        if not ok:
            if not self._txn_depth.get(shared):
                shared.open_gate(self)
            return result  # type: ignore[return-value]
        self._txn_depth[shared] = self._txn_depth.get(shared, 0) + 1
        return wire.reply_ok().message()

    def _resume_txn_start(self, shared: SharedDatabase) -> None:
        if not self.closed:
            reply = self._txn_start(shared, False)
            if reply is not None:
                self._send(reply, False)

    def _txn_end(self, shared: SharedDatabase, commit: bool) -> bytes:
        depth = self._txn_depth.get(shared, 0)
        if depth == 0:
            return wire.reply_error(nt.NT_STATUS_NOT_SUPPORTED,
                                    "no transaction of this connection on this database")
        if depth == 1:
            del self._txn_depth[shared]
        else:
            self._txn_depth[shared] = depth - 1
        name = "TRANSACTION commit" if commit else "TRANSACTION cancel"
        ok, result = self._adapter(shared, name, (lambda db: db.transaction_commit()) if commit
                                   else (lambda db: db.transaction_cancel()))
        if depth == 1:
            shared.open_gate(self)
        return wire.reply_ok().message() if ok else result  # type: ignore[return-value]


_HANDLERS: dict[Op, Callable[[Session, SharedDatabase, int, Reader], Reply]] = {
    Op.CLOSE: Session._close,
    Op.FETCH: Session._fetch,
    Op.LOCK: Session._lock,
    Op.UNLOCK: Session._unlock,
    Op.STORE: Session._store,
    Op.DELETE: Session._delete,
    Op.WRITE_THROUGH: Session._write_through,
    Op.EXISTS: Session._exists,
    Op.SEQNUM: Session._seqnum,
    Op.TRAVERSE_START: Session._traverse_start,
    Op.TRAVERSE_NEXT: Session._traverse_next,
    Op.TRAVERSE_END: Session._traverse_end,
    Op.TRANSACTION: Session._transaction,
    Op.WIPE: Session._wipe,
    Op.CHECK: Session._check,
    Op.DB_ID: Session._db_id,
    Op.NODE_CACHE: Session._node_cache,
    Op.MOVE_IN: Session._move_in,
    Op.HAND_OVER: Session._hand_over,
}

