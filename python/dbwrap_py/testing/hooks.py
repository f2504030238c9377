"""What tests and benchmarks need of an adapter beyond dbwrap, kept out of
the adapter: a throwaway store, the node lease of an agent beside it, the
store's own request counters and what it holds now, and the name a run's
results are shown under.

An adapter's hooks are found by its name through the ``dbwrap_py.testing``
entry points (setup.py), so no runtime module imports a throwaway server;
an adapter without any (a third party's, a dotted module) gets these
defaults: no throwaway store, nothing counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from functools import cache
from importlib.metadata import entry_points

ENTRY_POINTS = "dbwrap_py.testing"


class TestHooks:
    """The defaults; an adapter's hooks override what its store offers."""

    __test__ = False  # not a pytest class

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """A store to test against, when ``options`` name none: a context
        manager that starts a throwaway server (127.0.0.1, temporary data,
        stopped by PID on exit) and yields the options that reach it, for
        example ``{"endpoints": "127.0.0.1:23790"}``; None when the backend
        needs no server or ``options`` give one. The store only:
        servers.backend_options adds what sits beside it, a node agent for
        ``node_cache``, a node daemon for ``transport=proxy``."""
        return None

    def throwaway_agent_ttl(self, options: Mapping[str, str]) -> float:
        """The node lease, in seconds, of a throwaway node agent on the store."""
        from dbwrap_py.nodecache.agent import DEFAULT_TTL

        return float(DEFAULT_TTL)

    def store_counters(self, options: Mapping[str, str]) -> dict[str, int]:
        """The store's own request counters (name -> total so far), for the
        benchmarks' requests per SMB2 open+close."""
        return {}

    def target_label(self, name: str, options: Mapping[str, str]) -> str:
        """How tables and charts name the adapter ``name`` run with
        ``options`` (dbwrap_py.bench.targets.display_name). An adapter's
        hooks override it when an option changes what is measured, so that
        a result is never shown under a name it did not earn (``fdb (model)``)."""
        return name

    def diagnose(self, options: Mapping[str, str]) -> list[str]:
        """Lines that say what the store holds now (locks, claims, requests,
        a throwaway server's log), for a failed soak to print."""
        return []


class LeasedHooks(TestHooks):
    """A LeasedAdapter's: a throwaway agent's node lease is the records'
    lease (at least ``minimum`` seconds)."""

    def __init__(self, adapter: str, minimum: float = 0.0) -> None:
        self.adapter, self.minimum = adapter, minimum

    def throwaway_agent_ttl(self, options: Mapping[str, str]) -> float:
        from dbwrap_py.registry import find_adapter

        return max(find_adapter(self.adapter).lease_for(options), self.minimum)


@cache
def hooks_for(adapter: str) -> TestHooks:
    """The hooks of the adapter called ``adapter``; for a dotted name (a
    prototype module, often a built-in adapter changed a little), those of
    the nearest registered adapter it derives from; else the defaults."""
    found = entry_points(group=ENTRY_POINTS, name=adapter)
    if found:
        return next(iter(found)).load()
    if "." in adapter:
        return _hooks_of_a_base(adapter)
    return TestHooks()


def _hooks_of_a_base(adapter: str) -> TestHooks:
    from dbwrap_py.errors import DbwrapError
    from dbwrap_py.registry import find_adapter

    registered = {}
    for entry in entry_points(group=ENTRY_POINTS):
        try:  # scylla's driver and cassandra's cannot share a venv: skip what does not import
            registered.setdefault(find_adapter(entry.name), entry.name)
        except DbwrapError:
            continue
    for base in find_adapter(adapter).__mro__[1:]:
        if base in registered:
            return hooks_for(registered[base])
    return TestHooks()
