"""fdb: Samba's databases in FoundationDB, on the real ``fdb`` Python API
(PyPI ``foundationdb``), as a user with a cluster runs it: ``fdb.api_version(N)``,
then ``fdb.open(cluster_file)``.

Not run against FoundationDB here: no fdbserver or libfdb_c.so can be
installed on this machine. ``fdb_library = model`` runs the same code on
``dbwrap_py.testing.fdb_model``, a model of FoundationDB's transactions;
results there are labelled ``fdb (model)``. That option only chooses which
module is imported: nothing else here knows about the model.

Layout, record locks, fencing, value chunks and receipts: ``store.py``.
In short: a record lock is a key holding (token, expiry read version), taken
in one transaction with the read of the record (lock_get); every locked write
reads the lock key, so a holder whose lock was taken over cannot commit; a
write and its unlock are one transaction (put_unlock). A waiter waits on a
``watch`` of the lock key, up to the holder's remaining lease (in the
cluster's versions), not by polling. Expiry is judged in read versions, never
a client's clock. Values over 100,000 bytes are split across keys in one
transaction. A commit that ends in 1021 commit_unknown_result is retried
only if its receipt says it did not land.

Fork: libfdb_c's network thread starts once per process and does not
survive fork(). The process that opened a database never starts it: it may
fork next, as smbd's parent does after a few operations of its own
(smbXsrv_version_global_init). Its operations run in its keeper
(``keeper.py``: one exec'd process with a network of its own), and each
forked child starts its own network on its first operation. A child forked
after its parent started the network anyway does not touch it: it runs its
operations in a relay process of its own (``relay.py``).

TDB_CLEAR_IF_FIRST, as tdb: a volatile database is wiped at open when no
process that opened it lives. A process whose network runs joins the openers
at open; one without (smbd's parent) has its opener keeper join for it
(``keeper.py``: one exec'd process per such process, renewing its opener
keys while it lives), so opening never starts the network.

Persistent databases' transactions: a transaction lock key (``t``) that
record lockers respect, writes buffered in the process, and one FoundationDB
transaction at commit, within its 10,000,000-byte limit (InvalidParameter,
with the size, beyond it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import TypedDict

from dbwrap_py.adapter import Capabilities, DatabaseSpec
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.adapters.fdb import nodestore
from dbwrap_py.adapters.fdb import ownership as nodes
from dbwrap_py.adapters.fdb import store as _fdb_store
from dbwrap_py.adapters.fdb.keeper import KeeperClient, KeeperStore
from dbwrap_py.adapters.fdb.relay import RelayStore, RemoteStore
from dbwrap_py.adapters.fdb.store import FdbStore
from dbwrap_py.errors import ConfigError, Unavailable
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, PREFIX, Keep, LeaseSource
from dbwrap_py.nodecache.adapter import node_cache_mode
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import DEFAULT, UNTIL_WOKEN
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_LEASE = 2.0
DEFAULT_PREFIX = "dbwrap_py"
DEFAULT_PAGE_SIZE = 500
#: where fdb.open looks without a cluster file (Linux packages)
DEFAULT_CLUSTER_FILE = "/etc/foundationdb/fdb.cluster"
#: one value; a locked write is one transaction, and FoundationDB's limit is 10,000,000 bytes
MAX_VALUE_SIZE = 4 * 1024 * 1024
MODEL_NOTE = ("fdb_library = model: the model of FoundationDB (dbwrap_py.testing.fdb_model), "
              "not FoundationDB; label results 'fdb (model)'")


class StoreArgs(TypedDict):
    """What a process needs to open a database's store (it crosses to a relay)."""

    library: str
    api_version: int
    cluster_file: str | None
    prefix: bytes
    db: bytes
    volatile: bool
    timeout_ms: int
    retry_limit: int
    #: join the openers when the store opens (False: this process's keeper holds its place)
    join: bool
    opener_ttl: float


class FdbAdapter(TransactionalLeasedAdapter):
    """One Samba database in FoundationDB (see the module docstring)."""

    capabilities = Capabilities(
        transactions=True,
        lock_release_seconds=DEFAULT_LEASE,
        max_value_size=MAX_VALUE_SIZE,
        notes=("values over 100,000 bytes are split across keys, written in one transaction",
               "a persistent database's transaction commits at most 10,000,000 bytes"),
    )
    options_schema = (
        *LEASE_OPTIONS, library.FDB_LIBRARY,
        Option("cluster_file", str, "", help="the fdb.cluster file (default: fdb's own)"),
        Option("api_version", int, library.DEFAULT_API_VERSION, minimum=13, help="the FoundationDB API version"),
        PREFIX.with_default(DEFAULT_PREFIX),
        Option("transaction_timeout", float, 5.0, minimum=0.0,
               help="seconds one FoundationDB transaction may take, retries included"),
        Option("retry_limit", int, 100, minimum=-1, help="retries of one transaction (-1: no limit)"),
        Option("page_size", int, DEFAULT_PAGE_SIZE, minimum=1, help="keys per range read"),
    )
    default_lease = DEFAULT_LEASE
    lease_source = LeaseSource.STORE_CLOCK
    #: a refused take leaves a watch on what refused it: a waiter sleeps on it
    #: until woken, the holder's lease ends, or op_timeout
    lock_wait = transaction_lock_wait = UNTIL_WOKEN
    transaction_lock_refused = "another process holds the transaction lock or a record lock"

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self._base_args = base_store_args(options)
        self.library = self._base_args["library"]
        self.prefix = self._base_args["prefix"]
        self.page_size = options.value("page_size")
        refuse_unsafe_node_cache(self.library, options)
        # selects the API version and loads libfdb_c now, so a missing library fails the
        # open with its name; the network thread is not started here (see the docstring)
        self.fdb = library.load(self.library, self._base_args["api_version"])
        self.capabilities = self.declared_capabilities(options)
        self._store_pid = -1
        self._store: FdbStore | RemoteStore | None = None
        self._opener_pid = os.getpid()
        self._closed = False
        self._kept = False  # this process's opener keeper holds its place among the openers
        #: the read version of the last CLEAR_IF_FIRST wipe (the node cache voids tokens up to it)
        self.wipe_revision = 0
        if not spec.persistent:
            self._join_openers()

    def _join_openers(self) -> None:
        """TDB_CLEAR_IF_FIRST at open, as tdb: wipe if no process that opened
        the database lives, and count as one from now on. Where the network
        runs already, the store joins; elsewhere (smbd's parent) the opener
        keeper does, so the network is not started here."""
        if library.network_here():
            store = self.store()
            self.wipe_revision = store.wipe_revision
            return
        self.wipe_revision = KeeperClient.for_this_process(_fdb_store.OPENER_TTL).join(self.store_arguments())
        self._kept = True

    # -- the store of this process -------------------------------------------

    def store(self) -> FdbStore | RemoteStore:
        """Where this process's operations run: in the process, on its own
        network (a forked child: the network starts here); in its keeper
        (the process that opened the database, which may fork next, as
        smbd's parent does); or in a relay (a child forked after its parent
        started the network anyway)."""
        if self._store is not None and self._store_pid == os.getpid() and not self._relay_gone():
            return self._store
        if self._closed:
            raise Unavailable("the database is closed")
        args = self.store_arguments()
        longest_call = self.op_timeout + args["timeout_ms"] / 1000
        store: FdbStore | RemoteStore
        if library.started_elsewhere() is not None:
            store = RelayStore(args, longest_call)  # our inherited network is not ours
        elif os.getpid() == self._opener_pid and not library.network_here():
            store = KeeperStore(args, longest_call)
        else:
            store = open_store(self.fdb, args)
        self._store, self._store_pid = store, os.getpid()
        return store

    def _relay_gone(self) -> bool:
        """A relay that died or hung is replaced on the next call (its record
        locks lapse with their leases)."""
        return isinstance(self._store, RelayStore) and self._store.gone

    def store_arguments(self) -> StoreArgs:
        """What a process needs to open this database's store (a relay gets it too)."""
        return {**self._base_args, "db": self.spec.cluster_name.encode(),
                "volatile": not self.spec.persistent, "join": not self._kept}

    # -- the primitives (dbwrap_py.leased) ----------------------------------------

    def take_lease(self, key: bytes, token: int, seconds: float, read: bool) -> tuple[bool, bytes | None]:
        return self.store().take_lease(key, token, seconds, read)

    def wait_for_release(self, key: bytes, pause: float) -> None:
        """``pause``: until op_timeout (``lock_wait``); a poll if no watch was left."""
        self.store().wait_for_release(key, min(pause, DEFAULT.cap), pause)

    def renew_lease(self, key: bytes, token: int, seconds: float) -> bool:
        return bool(self.store().renew_lease(key, token, seconds))

    def fenced_write(self, key: bytes, token: int, value: bytes | None) -> bool:
        return self.store().fenced_write(key, token, value, False)

    def end_lease(self, key: bytes, token: int, value: bytes | None | Keep = KEEP) -> bool:
        if isinstance(value, Keep):
            self.store().release(key, token)
            return True
        return self.store().fenced_write(key, token, value, True)

    # -- reads ----------------------------------------------------------------------

    def read_record(self, key: bytes) -> bytes | None:
        value, by_node = self.store().get(key)
        return self.read_from_its_node(key) if by_node else value

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        after: bytes | None = None
        while True:
            records, after = self.store().scan_page(after, self.page_size)
            for key, value in records:  # a relay's answer may hold them as lists
                yield key, value
            if after is None:
                break

    def seqnum(self) -> int:
        return self.store().seqnum()

    def wipe_records(self) -> None:
        self.store().wipe()

    def db_id(self) -> bytes:
        return self.prefix + b"\0" + self.spec.cluster_name.encode()

    # -- transactions (persistent databases) -------------------------------------------

    def take_transaction_lock(self, token: int, seconds: float) -> bool:
        """Refused too while another process holds a record lock (ours do not count)."""
        return bool(self.store().take_txn_lock(token, seconds, set(self._tokens.values())))

    def renew_transaction_lock(self, token: int, seconds: float) -> bool:
        return self.take_transaction_lock(token, seconds)

    def wait_for_transaction_lock(self, pause: float, left: float) -> None:
        self.store().wait_for_release(None, min(pause, DEFAULT.cap), pause)  # the watch on what refused us

    def commit_transaction(self, token: int, writes: Writes) -> bool:
        return bool(self.store().commit_txn(token, writes))

    def release_transaction_lock(self, token: int) -> None:
        self.store().release_txn_lock(token)

    # -- process lifecycle -----------------------------------------------------------

    def after_fork(self) -> None:
        super().after_fork()
        self._kept = False  # the parent's keeper holds the parent's place; this child joins on its own
        self._store = None  # the parent's: never closed or used here
        self._store_pid = -1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._store is not None and self._store_pid == os.getpid():
            self._store.close()
        self._store = None
        if self._kept:
            KeeperClient.leave(self.store_arguments())
            self._kept = False

    # -- the node cache (dbwrap_py.nodecache.protocol; ours: ownership.py) ----------------

    @property
    def node_cache_id(self) -> bytes:
        return self.spec.cluster_name.encode()

    def ownership(self) -> nodes.FdbOwnership:
        """This database's ownership operations, on this process's store (or relay)."""
        return nodes.FdbOwnership(lambda method, *args: self.store().ownership(method, *args), self.op_timeout)

    @classmethod
    def node_store(cls, options: Options) -> nodestore.FdbNodeStore:
        """The node agent's side (``dbwrap-py node-agent --adapter fdb``), on its own network."""
        base = base_store_args(options)
        refuse_unsafe_node_cache(base["library"], options, agent=True)
        fdb = library.load(base["library"], base["api_version"])
        return nodestore.FdbNodeStore(lambda db: open_store(fdb, {**base, "db": db}),
                                      cls.options_of(options).value("op_timeout"))

    @property
    def round_trips(self) -> int:
        """FoundationDB transactions this process's store ran (a relay's are its own)."""
        return getattr(self._store, "round_trips", 0) if self._store_pid == os.getpid() else 0

    # -- for the conformance suite and the benchmarks -------------------------------------

    @classmethod
    def declared_capabilities(cls, options: Mapping[str, str]) -> Capabilities:
        caps = super().declared_capabilities(options)
        notes = (*caps.notes, "record lock expiry is judged in FoundationDB read versions")
        if library.kind_of(options) == "model":
            notes = (MODEL_NOTE, *notes)
        return dataclasses.replace(caps, notes=notes)


def base_store_args(options: Options) -> StoreArgs:
    """The store arguments every database of these options shares (db,
    volatile and join are the database's own)."""
    options = options.with_schema(FdbAdapter.options_schema)
    prefix = options.value("prefix")
    if not prefix:
        raise ConfigError("option prefix must not be empty")
    # absolute, as this process names it now: the opener keeper and the relays run in /
    cluster_file = options.value("cluster_file")
    # transaction_timeout is per FoundationDB transaction, retries included
    return {"library": library.kind_of(options),
            "api_version": options.value("api_version"),
            "cluster_file": os.path.abspath(cluster_file) if cluster_file else None,  # None: fdb's default
            "prefix": prefix.encode(), "db": b"", "volatile": True,
            "timeout_ms": int(options.value("transaction_timeout") * 1000),
            "retry_limit": options.value("retry_limit"), "join": False,
            "opener_ttl": _fdb_store.OPENER_TTL}


def refuse_unsafe_node_cache(kind: str, options: Options, agent: bool = False) -> None:
    """The node cache's leases are judged in read versions, which a real
    cluster moves ahead at a recovery: a node could go on serving records
    that another node has taken. Until leases are judged otherwise, the node
    cache runs on the model only (where versions never jump)."""
    if kind == "real" and (agent or node_cache_mode(options) is not None):
        raise ConfigError("node_cache on FoundationDB is not safe yet: node leases are judged in read "
                          "versions, which a recovery moves ahead (docs/adapters/fdb.md); it runs on "
                          "fdb_library = model only")


def open_store(fdb: ModuleType, args: StoreArgs) -> FdbStore:
    """This process's store: fdb.open (the network starts here, once), then
    the database's keys; a volatile database joins its openers."""
    db = library.open_database(fdb, args["library"], args["cluster_file"])
    if args["timeout_ms"]:
        db.options.set_transaction_timeout(args["timeout_ms"])
    db.options.set_transaction_retry_limit(args["retry_limit"])
    store = FdbStore(fdb, db, args["prefix"], args["db"], args["volatile"], args["opener_ttl"])
    if store.volatile and args["join"]:
        store.join_openers()
        store.keep_renewing()
    return store


ADAPTER = FdbAdapter
