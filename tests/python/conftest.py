"""Which tests share a pytest-xdist worker when make test-python runs the
files side by side (``--dist loadgroup``), and the one Cassandra they share.

Every test is in its file's group, so a file runs on one worker and its
module-scoped server starts once. Every test that runs a Cassandra is in
one group instead, one after the other on one worker: a Cassandra is a JVM
that keeps a core busy while it starts and serves, and several at once on 2
cores starved the node agents of their 2 s leases (measured in a make test
with the files spread over 4 workers: a node lease that lapsed, a record
handed over in 0.72 s where the test allows 0.5, a node agent that took
more than 15 s to come up).

The modules that need a plain one-node Cassandra share one for the whole
run (``cassandra_server``, session-scoped: on that one worker, one start),
each in a keyspace of its own (``shared_cassandra``). A Cassandra takes
about 3 s to start here and its JVM warms up over the first statements.
etcd (0.1 s) and Ceph (0.5 s, measured the same way) start fast enough
that each module keeps its own, where no module's leases and node names
can reach another's; so do the tests that stop, pause or reconfigure a
server (three nodes, passwords, a killed node).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def _runs_cassandra(item: pytest.Item) -> bool:
    if item.path.stem.startswith("test_cassandra") or item.path.stem == "test_scylla_dialect":
        return True
    callspec = getattr(item, "callspec", None)  # test_node_cache's backends, one parameter each
    return callspec is not None and "cassandra" in callspec.params.values()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("cassandra" if _runs_cassandra(item) else item.path.stem))


class Keyspaced:
    """A shared Cassandra as one module sees it: its options name the
    module's own keyspace, so no table, node lease or opener of one module
    is seen by another."""

    def __init__(self, cluster: Any, keyspace: str) -> None:
        self._cluster = cluster
        self.keyspace = keyspace

    def options(self) -> dict[str, str]:
        return {**self._cluster.options(), "keyspace": self.keyspace}


@pytest.fixture(scope="session")
def cassandra_server() -> Iterator[Any]:
    """One one-node throwaway Cassandra for the run (see the module docstring)."""
    pytest.importorskip("cassandra")
    from dbwrap_py.adapters import _cassandra_client as cc
    from dbwrap_py.adapters._cassandra_server import CassandraCluster

    with CassandraCluster(nodes=1) as cluster:
        yield cluster
    cc.close_all()


@pytest.fixture(scope="module")
def shared_cassandra(cassandra_server: Any, request: pytest.FixtureRequest) -> Keyspaced:
    """The shared Cassandra in a keyspace named after the test module."""
    return Keyspaced(cassandra_server, "t_" + request.module.__name__.rsplit(".", 1)[-1])
