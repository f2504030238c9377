"""fdb: Samba's databases in FoundationDB, on the real ``fdb`` Python API
(PyPI ``foundationdb``), as a user with a cluster runs it: ``fdb.api_version(N)``,
then ``fdb.open(cluster_file)``. How it works, and what ran: docs/adapters/fdb.md.

Not run against FoundationDB here: no fdbserver or libfdb_c.so can be
installed on this machine. ``fdb_library = model`` runs the same code on
``dbwrap_py.testing.fdb_model``, a model of FoundationDB's transactions;
results there are labelled ``fdb (model)``. That option only chooses which
module is imported (``library.py``): nothing else here knows about the model.

Record locks, fencing, chunks, receipts and transactions: ``store.py``. The
process that opened a database never starts the network (it may fork next):
its operations run in its keeper (``keeper.py``), a forked child's on its own
network, or in a relay (``relay.py``) if its parent had started one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping

from dbwrap_py.adapter import Capabilities, DatabaseSpec
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.adapters.fdb import nodestore
from dbwrap_py.adapters.fdb import ownership as nodes
from dbwrap_py.adapters.fdb.keeper import KeeperClient, KeeperStore
from dbwrap_py.adapters.fdb.library import StoreArgs, base_store_args, open_store
from dbwrap_py.adapters.fdb.relay import RelayStore, RemoteStore
from dbwrap_py.adapters.fdb.store import OPENER_TTL, FdbStore
from dbwrap_py.errors import Unavailable
from dbwrap_py.leased import KEEP, LEASE_OPTIONS, Keep, LeaseSource
from dbwrap_py.options import Option, Options
from dbwrap_py.retry import DEFAULT, UNTIL_WOKEN
from dbwrap_py.transactions import TransactionalLeasedAdapter, Writes

DEFAULT_LEASE = 2.0
DEFAULT_PAGE_SIZE = 500
#: one value; a locked write is one transaction, and FoundationDB's limit is 10,000,000 bytes
MAX_VALUE_SIZE = 4 * 1024 * 1024


class FdbAdapter(TransactionalLeasedAdapter):
    """One Samba database in FoundationDB (see the module docstring)."""

    capabilities = Capabilities(
        transactions=True,
        lock_release_seconds=DEFAULT_LEASE,
        max_value_size=MAX_VALUE_SIZE,
        notes=("values over 100,000 bytes are split across keys, written in one transaction",
               "a persistent database's transaction commits at most 10,000,000 bytes"),
    )
    options_schema = (*LEASE_OPTIONS, *library.CLIENT_OPTIONS,
                      Option("page_size", int, DEFAULT_PAGE_SIZE, minimum=1, help="keys per range read"))
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
        nodes.refuse_unsafe_node_cache(self.library, options)
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
        self.wipe_revision = KeeperClient.for_this_process(OPENER_TTL).join(self.store_arguments())
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
        nodes.refuse_unsafe_node_cache(base["library"], options, agent=True)
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
            notes = (library.MODEL_NOTE, *notes)
        return dataclasses.replace(caps, notes=notes)


ADAPTER = FdbAdapter
