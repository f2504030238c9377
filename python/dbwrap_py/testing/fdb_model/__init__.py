"""A model of FoundationDB, for tests: not FoundationDB.

No fdbserver or libfdb_c can be installed on this machine, so the fdb
adapter, written for the real ``fdb`` package, is exercised against this
model of FoundationDB's transaction semantics (read versions, MVCC reads,
optimistic read/write conflict ranges, snapshot reads, watches, the size
limits, transaction_too_old, commit_unknown_result). Results on it are
labelled ``fdb (model)`` and never count as FoundationDB working.

This package is importable in place of ``fdb``: it exports the subset of
that API the adapter uses (``client``). The store is a server process on a
unix socket, or on TCP at one address of this host for a networked
cluster's nodes (``server``), shared by every process that opens the same
cluster file; ``throwaway`` starts one for a test run.
"""

from dbwrap_py.testing.fdb_model.client import (
    LATEST_API_VERSION,
    Control,
    Database,
    FDBError,
    Future,
    KeyValue,
    Transaction,
    Value,
    api_version,
    get_api_version,
    is_api_version_selected,
    open,
    predicates,
    transactional,
)

__all__ = [
    "LATEST_API_VERSION", "Control", "Database", "FDBError", "Future", "KeyValue", "Transaction", "Value",
    "api_version", "get_api_version", "is_api_version_selected", "open", "predicates", "transactional",
]
