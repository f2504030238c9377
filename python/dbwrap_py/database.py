"""dbwrap's contract on top of one adapter. This is the object the C bridge calls.

Every public method here is one dbwrap operation. The record rules (hold
counts for re-entrant locks, whether the database is usable, type checks on
the adapter's answers) live in one place, the C object ``self.records``
(dbwrap_py._records.Records): the methods here call it, and so does the
bridge, without a Python frame, for its hot record calls. Each other method
checks what the adapter returned, so a wrong type becomes an
AdapterContractError (an NTSTATUS), never a crash.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Iterator, Sequence

from dbwrap_py._records import Records
from dbwrap_py.adapter import Adapter, DatabaseSpec
from dbwrap_py.nodecache.adapter import OPTIONS_SCHEMA as NODE_CACHE_OPTIONS
from dbwrap_py.nodecache.adapter import CachedAdapter, node_cache_mode, supports_node_cache
from dbwrap_py.nodecache.adapter import ready_cache_dir, serving_node
from dbwrap_py.errors import (
    AdapterContractError,
    ConfigError,
    NameCollision,
    NotFound,
    NotSupported,
    Unavailable,
)
from dbwrap_py.options import Option, Options
from dbwrap_py.registry import find_adapter

# Store flags (lib/tdb/include/tdb.h); any other value replaces, as in tdb.
TDB_INSERT = 2
TDB_MODIFY = 3

_open_databases: "weakref.WeakSet[Database]" = weakref.WeakSet()


def _value(result: object, what: str) -> bytes | None:
    if result is None or type(result) is bytes:
        return result  # type: ignore[return-value]
    if isinstance(result, (bytearray, memoryview)):
        return bytes(result)
    raise AdapterContractError(f"{what} returned {type(result).__name__}, expected bytes or None")


def _pair(item: object, what: str) -> tuple[bytes, bytes]:
    if not (isinstance(item, tuple) and len(item) == 2):
        raise AdapterContractError(f"{what} yielded {type(item).__name__}, expected (key, value)")
    key, value = _value(item[0], what), _value(item[1], what)
    if key is None or value is None:
        raise AdapterContractError(f"{what} yielded None in a (key, value) pair")
    return key, value


class Database:
    """One open database: dbwrap semantics over ``adapter``."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.spec = adapter.spec
        #: what the adapter declares for the options it was opened with
        self.capabilities = type(adapter).declared_capabilities(adapter.options)
        #: the record rules; the C bridge calls them too (c_core/records_api.h)
        self.records = Records(adapter, self.capabilities.max_value_size or 0)
        self._txn_depth = 0
        self._txn_doomed = False
        self._closed = False
        _open_databases.add(self)

    # -- records ----------------------------------------------------------

    def fetch(self, key: bytes) -> bytes | None:
        """parse_record: the value, or None for a missing key."""
        return self.records.fetch(key)

    def lock(self, key: bytes) -> bytes | None:
        """fetch_locked / do_locked: lock the record, then read it.

        Locks are re-entrant within the process: the adapter's lock is taken
        with the first hold, and a nested hold reads the holder's own writes.
        """
        return self.records.lock(key)

    def unlock(self, key: bytes, value: bytes | None = None) -> None:
        """Release one hold; the adapter's lock goes with the last one.

        ``value`` is a store made inside do_locked, which the bridge sends
        with the unlock: one crossing, and adapters may write and release in
        one round trip (put_unlock). The lock is released even if it fails.
        """
        self.records.unlock(key, value)

    def store(self, key: bytes, value: bytes, flag: int) -> None:
        """storev on a locked record, with tdb's TDB_INSERT/TDB_MODIFY statuses."""
        if flag == TDB_INSERT or flag == TDB_MODIFY:
            exists = self.exists(key)
            if flag == TDB_INSERT and exists:
                raise NameCollision("TDB_INSERT on an existing key")
            if flag == TDB_MODIFY and not exists:
                raise NotFound("TDB_MODIFY on a missing key")
        self.records.store(key, value)

    def delete(self, key: bytes) -> None:
        """delete_rec on a locked record; NotFound for a missing key, as tdb."""
        self._check_usable()
        existed = self.adapter.remove(key)
        if type(existed) is not bool:
            raise AdapterContractError(f"remove returned {type(existed).__name__}, expected bool")
        if not existed:
            raise NotFound("delete of a missing key")

    def write_through(self, key: bytes) -> None:
        """The locked record's value, or its absence, is in the backend now
        (Adapter.write_through): per-record persistence asks it of a
        persistent record and of the next write of one."""
        self._check_usable()
        self.adapter.write_through(key)

    def exists(self, key: bytes) -> bool:
        self._check_usable()
        result = self.adapter.exists(key)
        if type(result) is not bool:
            raise AdapterContractError(f"exists returned {type(result).__name__}, expected bool")
        return result

    def traverse(self, write: bool) -> Iterator[tuple[bytes, bytes]]:
        """Every record. With ``write``, each is locked while the caller sees it.

        The read-write form walks a snapshot of the keys, so the callback may
        delete or store the current record, and skips keys deleted meanwhile.
        """
        self._check_usable()
        try:
            items = iter(self.adapter.scan())
        except TypeError:
            raise AdapterContractError("scan returned something that is not iterable") from None
        if not write:
            for item in items:
                yield _pair(item, "scan")
            return
        keys = [_pair(item, "scan")[0] for item in items]
        for key in keys:
            value = self.lock(key)
            try:
                if value is not None:
                    yield key, value
            finally:
                self.unlock(key)

    # -- database-wide ----------------------------------------------------

    def seqnum(self) -> int:
        self._check_usable()
        result = self.adapter.seqnum()
        if type(result) is not int:
            raise AdapterContractError(f"seqnum returned {type(result).__name__}, expected int")
        return result & 0x7FFFFFFF  # dbwrap's get_seqnum returns a C int

    def lock_renewal_seconds(self) -> float | None:
        """How often keep_locks_alive must run while records are locked (None: never)."""
        return self.adapter.lock_renewal_seconds()

    def keep_locks_alive(self) -> None:
        """Renew the adapter's expiring record locks (for a holder that must not lose them)."""
        self.adapter.keep_locks_alive()

    def transaction_start(self, nonblock: bool) -> None:
        """Nested starts only count, as in tdb; the adapter sees one level."""
        self._check_usable()
        if not self.capabilities.transactions:
            raise NotSupported(f"{type(self.adapter).__name__} declares no transactions")
        if not self.spec.persistent:
            raise NotSupported("transactions need a persistent database")
        if self._txn_depth == 0:
            self.adapter.transaction_start(nonblock)
            self._txn_doomed = False
        self._txn_depth += 1

    def transaction_commit(self) -> None:
        """An inner commit only counts; the outer one fails after an inner cancel."""
        if self._txn_depth == 0:
            raise NotSupported("transaction_commit without a transaction")
        self._txn_depth -= 1
        if self._txn_depth > 0:
            return
        if self._txn_doomed:
            self.adapter.transaction_cancel()
            raise NotSupported("a nested transaction was cancelled; the commit is refused")
        self.adapter.transaction_commit()

    def transaction_cancel(self) -> None:
        if self._txn_depth == 0:
            raise NotSupported("transaction_cancel without a transaction")
        self._txn_depth -= 1
        if self._txn_depth > 0:
            self._txn_doomed = True
            return
        self.adapter.transaction_cancel()

    def wipe(self) -> None:
        self._check_usable()
        self.adapter.wipe()

    def check(self) -> None:
        self._check_usable()
        self.adapter.check()

    def db_id(self) -> bytes:
        result = _value(self.adapter.db_id(), "db_id")
        if not result:
            raise AdapterContractError("db_id returned nothing")
        return result

    def close(self) -> None:
        """Release this database's record locks, then the adapter (once)."""
        if self._closed:
            return
        self._closed = True
        self.records.mark_unusable(Unavailable("the database is closed"))
        _open_databases.discard(self)
        try:
            for key in self.records.take_holds():
                self.adapter.unlock(key)
        finally:
            self.adapter.close()

    # -- fork -------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # Locks and transactions belong to the parent process, not to us.
        self.records.forget_holds()
        self._txn_depth = 0
        try:
            self.adapter.after_fork()
        except Exception as exc:  # reported on the next call, in this process
            self.records.mark_unusable(
                Unavailable(f"after_fork failed: {type(exc).__name__}: {exc}"))

    def _check_usable(self) -> None:
        self.records.check_usable()


def _after_fork_in_child() -> None:
    for db in list(_open_databases):
        db._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


#: options of every adapter, read here
FRAMEWORK_OPTIONS = (Option("cluster_name", str, "path", help="path (the default) or file"),)


def named_by_file(options: Options) -> bool:
    """``cluster_name``: ``path`` (the default) or ``file`` (DatabaseSpec.cluster_name)."""
    text = options.get_str("cluster_name", "path").lower()
    if text not in ("path", "file"):
        raise ConfigError(f"cluster_name = {text!r}: use path or file")
    return text == "file"


def open_database(
    name: str,
    hash_size: int,
    tdb_flags: int,
    open_flags: int,
    mode: int,
    lock_order: int,
    dbwrap_flags: int,
    adapter_name: str,
    options: Sequence[str],
) -> Database:
    """db_open_py's Python half: find the adapter, check its options, open it."""
    parsed = Options.parse(options)
    cls = find_adapter(adapter_name)
    cached = supports_node_cache(cls)
    try:  # before the adapter exists, so a typo cannot create or wipe anything
        parsed.declare(cls.options_schema + FRAMEWORK_OPTIONS + (NODE_CACHE_OPTIONS if cached else ()))
        cache_mode = node_cache_mode(parsed) if cached else None
        by_file = named_by_file(parsed)
    except ConfigError as exc:
        raise ConfigError(f"adapter {adapter_name!r}: {exc}") from None
    spec = DatabaseSpec(name, hash_size, tdb_flags, open_flags, mode, lock_order, dbwrap_flags, by_file)
    cache_dir = ready_cache_dir(parsed, name) if cache_mode is not None and not spec.persistent else None
    if cache_dir is not None:
        spec = dataclasses.replace(spec, node=serving_node(cache_dir))
    adapter = cls(spec, parsed)
    if cache_mode is not None and cache_dir is not None:
        adapter = CachedAdapter(adapter, cache_mode, cache_dir)
    return Database(adapter)
