"""The sqlite_leased adapter's test hooks (dbwrap_py.testing.hooks): its
nodes share one cluster file, which a run with the node cache gets in a
temporary directory (the node agent the framework starts shares it)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from dbwrap_py.testing.hooks import LeasedHooks


class SqliteLeasedHooks(LeasedHooks):
    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """A temporary cluster file, for node_cache without a node_cache_dir
        or a cluster_file."""
        from dbwrap_py.nodecache.adapter import node_cache_mode
        from dbwrap_py.options import Options

        if node_cache_mode(Options(dict(options))) is None or options.get("node_cache_dir") \
                or options.get("cluster_file"):
            return None
        return _cluster_file()


@contextmanager
def _cluster_file() -> Iterator[dict[str, str]]:
    from dbwrap_py.adapters.sqlite_leased.ownership import CLUSTER_FILE

    directory = Path(tempfile.mkdtemp(prefix="dbwrap-py-sqlite-cluster-"))
    try:
        yield {"cluster_file": str(directory / CLUSTER_FILE)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


HOOKS = SqliteLeasedHooks("sqlite_leased")
