"""Which ``fdb`` module the fdb adapter runs on, and where its network may run.

``fdb_library = real`` imports the ``fdb`` package (PyPI ``foundationdb``),
which ctypes-loads libfdb_c.so when the API version is selected. ``model``
imports ``dbwrap_py.testing.fdb_model`` instead: a model of FoundationDB for
tests, with the same API. Nothing else differs between the two.

The network thread: ``fdb.open`` starts it, once per process; it cannot be
restarted, and fork() does not copy it. So it is started lazily, on the
first operation of a process, never at open (smbd's parent opens every
database, then forks). This module remembers which process started it: a
child forked after that must not touch the inherited one (``started_elsewhere``).

Here too: the options that choose and configure the client, what a process
needs to open a database's store (``StoreArgs``, which crosses to a keeper or
relay), and ``open_store``, which opens it in this process.
"""

from __future__ import annotations

import importlib
import os
import threading
from types import ModuleType
from collections.abc import Mapping
from typing import Any, TypedDict

from dbwrap_py.adapters.fdb.store import OPENER_TTL, FdbStore
from dbwrap_py.errors import ConfigError
from dbwrap_py.leased import PREFIX
from dbwrap_py.options import Option, Options

LIBRARIES = {"real": "fdb", "model": "dbwrap_py.testing.fdb_model"}
#: the API version of the pinned binding (foundationdb 7.3.x)
DEFAULT_API_VERSION = 730
#: which binding: real (libfdb_c) or model (the in-process test model)
FDB_LIBRARY = Option("fdb_library", str, "real", help="real (libfdb_c) or model (the test model)")
DEFAULT_PREFIX = "dbwrap_py"
#: where fdb.open looks without a cluster file (Linux packages)
DEFAULT_CLUSTER_FILE = "/etc/foundationdb/fdb.cluster"
MODEL_NOTE = ("fdb_library = model: the model of FoundationDB (dbwrap_py.testing.fdb_model), "
              "not FoundationDB; label results 'fdb (model)'")
#: the options a store is opened by (the adapter adds the lease's and page_size)
CLIENT_OPTIONS = (
    FDB_LIBRARY,
    Option("cluster_file", str, "", help="the fdb.cluster file (default: fdb's own)"),
    Option("api_version", int, DEFAULT_API_VERSION, minimum=13, help="the FoundationDB API version"),
    PREFIX.with_default(DEFAULT_PREFIX),
    Option("transaction_timeout", float, 5.0, minimum=0.0,
           help="seconds one FoundationDB transaction may take, retries included"),
    Option("retry_limit", int, 100, minimum=-1, help="retries of one transaction (-1: no limit)"),
)

_lock = threading.Lock()
_loaded: dict[str, tuple[ModuleType, int]] = {}
_network_pid: int | None = None
_databases: dict[tuple[str, str], Any] = {}


def kind_of(options: Mapping[str, str]) -> str:
    """The ``fdb_library`` option's value, normalised (``real`` if unset)."""
    return Options(dict(options), (FDB_LIBRARY,)).value("fdb_library").strip().lower()


def load(kind: str, api_version: int) -> ModuleType:
    """The module for ``kind``, its API version selected (this loads
    libfdb_c for the real one, but starts no thread)."""
    if kind not in LIBRARIES:
        raise ConfigError(f"fdb_library = {kind!r}: use real (the foundationdb package and "
                          "libfdb_c) or model (the model of FoundationDB, for tests)")
    with _lock:
        if kind in _loaded:
            module, selected = _loaded[kind]
            if selected != api_version:
                raise ConfigError(f"api_version {api_version}: this process already selected "
                                  f"{selected} (FoundationDB allows one per process)")
            return module
        try:
            module = importlib.import_module(LIBRARIES[kind])
        except ImportError as exc:
            raise ConfigError("fdb_library = real needs the Python package foundationdb "
                              f"(imported as fdb): {exc}") from exc
        try:
            module.api_version(api_version)
        except Exception as exc:  # the binding raises plain Exception/RuntimeError
            raise ConfigError(
                f"fdb_library = {kind}: the FoundationDB client library libfdb_c.so could not be "
                f"loaded for API version {api_version}: {exc} (install FoundationDB's client "
                "package, foundationdb-clients, from its releases)" if kind == "real" else
                f"fdb_library = model: API version {api_version}: {exc}") from exc
        _loaded[kind] = (module, api_version)
        return module


def started_elsewhere() -> int | None:
    """The PID that started the network, if that is not this process."""
    pid = _network_pid
    return pid if pid is not None and pid != os.getpid() else None


def network_here() -> bool:
    """This process started the network (so it may use it)."""
    return _network_pid == os.getpid()


def open_database(module: ModuleType, kind: str, cluster_file: str | None) -> Any:
    """``fdb.open(cluster_file)`` in this process, which starts the network
    here the first time. Never call it where ``started_elsewhere()``."""
    global _network_pid
    with _lock:
        if started_elsewhere() is not None:
            raise RuntimeError("the FoundationDB network was started before fork")
        key = (kind, cluster_file or "")
        db = _databases.get(key)
        if db is None:
            db = _databases[key] = module.open(cluster_file)
            _network_pid = os.getpid()
        return db


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


def base_store_args(options: Options) -> StoreArgs:
    """The store arguments every database of these options shares (db,
    volatile and join are the database's own)."""
    options = options.with_schema(CLIENT_OPTIONS)
    prefix = options.value("prefix")
    if not prefix:
        raise ConfigError("option prefix must not be empty")
    # absolute, as this process names it now: the opener keeper and the relays run in /
    cluster_file = options.value("cluster_file")
    # transaction_timeout is per FoundationDB transaction, retries included
    return {"library": kind_of(options),
            "api_version": options.value("api_version"),
            "cluster_file": os.path.abspath(cluster_file) if cluster_file else None,  # None: fdb's default
            "prefix": prefix.encode(), "db": b"", "volatile": True,
            "timeout_ms": int(options.value("transaction_timeout") * 1000),
            "retry_limit": options.value("retry_limit"), "join": False,
            "opener_ttl": OPENER_TTL}


def open_store(fdb: ModuleType, args: StoreArgs) -> FdbStore:
    """This process's store: fdb.open (the network starts here, once), then
    the database's keys; a volatile database joins its openers."""
    db = open_database(fdb, args["library"], args["cluster_file"])
    if args["timeout_ms"]:
        db.options.set_transaction_timeout(args["timeout_ms"])
    db.options.set_transaction_retry_limit(args["retry_limit"])
    store = FdbStore(fdb, db, args["prefix"], args["db"], args["volatile"], args["opener_ttl"])
    if store.volatile and args["join"]:
        store.join_openers()
        store.keep_renewing()
    return store
