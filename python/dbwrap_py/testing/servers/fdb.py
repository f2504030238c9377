"""The fdb adapter's test hooks (dbwrap_py.testing.hooks): the model of
FoundationDB for a run, and its runs labelled ``fdb (model)``. No real FoundationDB server can be started here."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from dbwrap_py.servers import ServerError
from dbwrap_py.testing.hooks import LeasedHooks


class FdbHooks(LeasedHooks):
    """A node agent's lease: the records', at least 2 s."""

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """With fdb_library = model and no cluster_file: a model server for the
        run, on a unix socket, or with ``throwaway_host`` (where it listens;
        not an adapter option: a networked cluster's bridge address) on TCP
        at a free port of that address, so nodes in namespaces of their own
        reach it through their profile's delay relay. A real cluster is never
        started here: with fdb_library = real,
        None when a cluster file is given or fdb's default one exists, and
        otherwise ServerError (so the suite and the benchmarks skip with the
        reason instead of failing every check)."""
        from dbwrap_py.adapters.fdb import library as library
        from dbwrap_py.adapters.fdb.library import DEFAULT_CLUSTER_FILE

        if options.get("cluster_file"):
            return None
        if library.kind_of(options) == "model":
            return _model(str(options["throwaway_host"]) if options.get("throwaway_host") else None)
        default = os.environ.get("FDB_CLUSTER_FILE") or DEFAULT_CLUSTER_FILE
        if not os.path.exists(default):
            raise ServerError(f"no FoundationDB cluster: give -o cluster_file=... ({default} does not "
                              "exist; a FoundationDB server cannot be started here), or "
                              "-o fdb_library=model for the model of FoundationDB")
        return None

    def target_label(self, name: str, options: Mapping[str, str]) -> str:
        """``fdb (model)`` on the model of FoundationDB: never shown as the real thing."""
        from dbwrap_py.adapters.fdb import library as library

        return f"{name} (model)" if library.kind_of(options) == "model" else name


@contextmanager
def _model(host: str | None) -> Iterator[dict[str, str]]:
    from dbwrap_py.testing.fdb_model.throwaway import model_server

    with model_server(host=host) as cluster_file:
        yield {"cluster_file": str(cluster_file)}


HOOKS = FdbHooks("fdb", minimum=2.0)
