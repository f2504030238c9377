"""The adapter API: what a backend must implement, and what it may override.

An adapter instance is one open Samba database in one process. The framework
(dbwrap_py.database.Database) turns dbwrap's contract into calls on it:

* must implement: ``get``, ``put``, ``remove``, ``scan``, ``lock``, ``unlock``;
* may override: ``lock_get``, ``put_unlock``, ``seqnum``, the ``transaction_*`` trio,
  ``exists``, ``wipe``, ``check``, ``db_id``, ``after_fork``, ``close``;
* declares: ``capabilities`` and ``options_schema`` (``option_names`` follows).

The framework derives, so an adapter need not:

* TDB_INSERT / TDB_MODIFY checks (the record is locked when storev runs);
* re-entrant record locks within one process (``lock`` is called once per key
  until the last holder in this process lets go), and read-your-writes for the
  lock holder, because writes reach the adapter at once;
* nested transactions with tdb's rules (the adapter sees one level);
* locked records during a read-write traverse;
* ``exists`` from ``get``, ``wipe`` from ``scan`` + ``remove``, ``check`` from
  ``scan``, ``db_id`` from the database name.

Errors are raised as the typed exceptions in dbwrap_py.errors.
"""

from __future__ import annotations

import abc
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dbwrap_py.errors import NotSupported
from dbwrap_py.options import Option, Options, schema_of

# tdb_flags bits that matter to backends (lib/tdb/include/tdb.h).
TDB_CLEAR_IF_FIRST = 1
TDB_SEQNUM = 128
TDB_INCOMPATIBLE_HASH = 2048
TDB_MUTEX_LOCKING = 4096


@dataclass(frozen=True)
class DatabaseSpec:
    """What smbd asked for in db_open(), as the adapter sees it."""

    name: str
    hash_size: int = 0
    tdb_flags: int = 0
    open_flags: int = os.O_RDWR | os.O_CREAT
    mode: int = 0o600
    lock_order: int = 0
    dbwrap_flags: int = 0
    #: option cluster_name = file: named by the file alone (see cluster_name)
    named_by_file: bool = False
    #: set by the framework, not smbd: the name of the node whose agent
    #: serves this volatile database's node cache as it opens; None without one
    node: bytes | None = None

    @property
    def persistent(self) -> bool:
        """dbwrap's rule: persistent unless opened with TDB_CLEAR_IF_FIRST."""
        return not self.tdb_flags & TDB_CLEAR_IF_FIRST

    @property
    def basename(self) -> str:
        """The file name without directories, e.g. ``locking.tdb``."""
        return os.path.basename(self.name)

    @property
    def cluster_name(self) -> str:
        """``<basename>@<16 hex digits of BLAKE2b over the absolute path>``, a
        database's name in a shared store: the same path names the same
        database on every host, and two folders holding ``locking.tdb`` do
        not collide. With option ``cluster_name = file``, the basename
        alone, as ctdb names databases: every node's ``locking.tdb`` is one
        database wherever its lock directory is (nodes sharing one host)."""
        if self.named_by_file:
            return self.basename
        path = os.path.abspath(self.name)
        return f"{self.basename}@{hashlib.blake2b(path.encode(), digest_size=8).hexdigest()}"


@dataclass(frozen=True)
class Capabilities:
    """What an adapter declares, and who acts on it."""

    #: False: Database refuses transaction_start with NotSupported before the
    #: adapter sees it; the conformance suite skips the transaction checks
    transactions: bool = False
    #: False (the in-process memory adapter): the conformance suite skips the
    #: multi-process checks, and the SMB benchmarks leave the adapter out
    multi_process: bool = True
    #: seconds after which a dead holder's lock is gone (0: at once, as with
    #: fcntl); the conformance suite waits this long for lock.release-on-kill
    lock_release_seconds: float = 0.0
    #: the largest value the backend stores, None for no limit: a larger
    #: store fails in the record rules with InvalidParameter, before the
    #: adapter sees it; kv.values stores exactly this much
    max_value_size: int | None = None
    #: things the adapter knowingly does not do, with the reason (reported)
    notes: tuple[str, ...] = field(default=())


class Adapter(abc.ABC):
    """One Samba database on one backend, in one process."""

    capabilities: Capabilities = Capabilities()
    #: the options this adapter reads (dbwrap_py.options.Option: name, type,
    #: default, secret); any other option, or a bad value, fails the open
    options_schema: tuple[Option, ...] = ()
    #: their names, derived from options_schema (an adapter that sets only
    #: this gets untyped string options, its base class's kept)
    option_names: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "options_schema" in cls.__dict__:
            cls.option_names = tuple(option.name for option in cls.options_schema)
        elif "option_names" in cls.__dict__:
            inherited = schema_of(cls.options_schema)
            cls.options_schema = tuple(inherited.get(name, Option(name)) for name in cls.option_names)

    @classmethod
    def options_of(cls, options: Mapping[str, str]) -> Options:
        """``options`` read by this adapter's schema, other names let be (a
        class-level reader such as lease_for sees the framework's too)."""
        return Options(dict(options), cls.options_schema)

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        self.spec = spec
        self.options = options
        options.adopt(type(self).options_schema)  # value() reads by it when not declared

    # -- must implement -------------------------------------------------

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""

    @abc.abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key``; the caller holds the record lock."""

    @abc.abstractmethod
    def remove(self, key: bytes) -> bool:
        """Delete ``key``; return whether it existed. The caller holds the lock."""

    @abc.abstractmethod
    def scan(self) -> Iterable[tuple[bytes, bytes]]:
        """Every (key, value) pair, in any order."""

    @abc.abstractmethod
    def lock(self, key: bytes) -> None:
        """Take the record lock on ``key`` for this process, waiting if needed.

        It must exclude other processes and be released if this process dies.
        It may raise Timeout rather than wait forever.
        """

    @abc.abstractmethod
    def unlock(self, key: bytes) -> None:
        """Release the record lock taken by ``lock``."""

    # -- may override ---------------------------------------------------

    def lock_get(self, key: bytes) -> bytes | None:
        """Lock, then read: the start of fetch_locked and do_locked.

        Override to do both in one round trip; the lock must not stay held
        when the read fails.
        """
        self.lock(key)
        try:
            return self.get(key)
        except BaseException:
            self.unlock(key)
            raise

    def put_unlock(self, key: bytes, value: bytes) -> None:
        """Store, then release the lock: the end of a do_locked that wrote.

        Override to do both in one round trip; the lock must be released
        even when the write fails.
        """
        try:
            self.put(key, value)
        finally:
            self.unlock(key)

    def write_through(self, key: bytes) -> None:
        """The locked record's value, or its absence, is in the backend when
        this returns (Samba 4.25's persistent records ask: a survivor of this
        node must find them). ``put`` and ``remove`` write there already;
        a cache that keeps records on the node (the node cache) overrides."""

    def seqnum(self) -> int:
        """A number that changes on every committed write seen by other processes."""
        raise NotSupported(f"{type(self).__name__} keeps no sequence number")

    def transaction_start(self, nonblock: bool = False) -> None:
        """Start a database-wide transaction (persistent databases only).

        With ``nonblock``, raise LockConflict instead of waiting.
        """
        raise NotSupported(f"{type(self).__name__} has no transactions")

    def transaction_commit(self) -> None:
        raise NotSupported(f"{type(self).__name__} has no transactions")

    def transaction_cancel(self) -> None:
        raise NotSupported(f"{type(self).__name__} has no transactions")

    def exists(self, key: bytes) -> bool:
        return self.get(key) is not None

    def wipe(self) -> None:
        for key, _ in list(self.scan()):
            self.lock(key)  # remove's contract: the caller holds the record lock
            try:
                self.remove(key)
            finally:
                self.unlock(key)

    def check(self) -> None:
        """Raise Corruption if the database is inconsistent."""
        for _ in self.scan():
            pass

    def db_id(self) -> bytes:
        """Bytes that identify this database; the watch layer keys on them."""
        return self.spec.name.encode()

    def after_fork(self) -> None:
        """Runs in a forked child: drop connections inherited from the parent."""

    def lock_renewal_seconds(self) -> float | None:
        """How often a holder that lives longer than its callers' pauses
        (the node daemon, whose connections never lose a lock while they
        live) calls keep_locks_alive; None: record locks never expire."""
        return None

    def keep_locks_alive(self) -> None:
        """Extend every record lock this adapter holds now."""

    def close(self) -> None:
        """Release what the adapter holds; the database is not used again."""

    # -- what it declares --------------------------------------------------

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        """What the adapter declares when opened with ``options``.

        Override when an option changes it, such as a lease time.
        """
        return cls.capabilities

