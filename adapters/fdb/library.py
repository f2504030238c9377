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
"""

from __future__ import annotations

import importlib
import os
import threading
from types import ModuleType
from collections.abc import Mapping
from typing import Any

from dbwrap_py.errors import ConfigError
from dbwrap_py.options import Option, Options

LIBRARIES = {"real": "fdb", "model": "dbwrap_py.testing.fdb_model"}
#: the API version of the pinned binding (foundationdb 7.3.x)
DEFAULT_API_VERSION = 730
#: which binding: real (libfdb_c) or model (the in-process test model)
FDB_LIBRARY = Option("fdb_library", str, "real", help="real (libfdb_c) or model (the test model)")

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
