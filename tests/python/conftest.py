"""Which tests share a pytest-xdist worker when make test-python runs the
files side by side (``--dist loadgroup``), and the Cassandra they share.

Every test is in its file's group, so a file runs on one worker and its
module-scoped server starts once; a file whose tests take a parametrized
module-scoped ``backend`` has a group per backend. Every test that runs a
Cassandra is in one of two groups instead, one after the other on each of
two workers: a Cassandra is a JVM that keeps a core busy while it starts
and serves, and several at once on 2 cores starved the node agents of
their 2 s leases (measured in a make test with the files spread over 4
workers: a node lease that lapsed, a record handed over in 0.72 s where
the test allows 0.5, a node agent that took more than 15 s to come up).
In one group they took 248 s, the step's longest path (stop 53); the node
cache's tests on Cassandra (120 s of it) are the second group, so at most
two Cassandras, compiled with C1 only, run at once.

The modules that need a plain one-node Cassandra share one for the whole
run (``cassandra_server``, session-scoped: on each of those two workers,
one start),
each in a keyspace of its own (``shared_cassandra``). A Cassandra takes
about 3 s to start here and its JVM warms up over the first statements.

So do the modules that need a plain one-node etcd or Ceph: one of each for
the whole run (``etcd_server``, ``ceph_server``), each module under a
prefix of its own (``shared_etcd``, ``shared_ceph``; tests/python/
shared_servers.py). Both adapters keep every key or object, node leases and
node registrations included, under option ``prefix``, so no module's
records, leases or node names reach another's. They start in 0.1 s and
0.5 s, but a run started one per module and worker, each a process (Ceph:
two) beside the tests on 2 cores: make test-python-servers, three runs each
way, started 25-27 etcds and 25-26 Ceph mons before, 16-17 and 12-14 after
(the rest are the tests' own servers and their restarts).

Those modules run on several workers at once, and a session fixture is per
worker, so one per run needs the pytest-xdist controller: when it hands
out tests and its ``-m`` can select a test marked ``server``, it starts
both before the workers (``pytest_configure``), hands each worker their
addresses (``pytest_configure_node``: ``workerinput``) and stops them by
PID at the end (``pytest_unconfigure``). A worker told of none (a run
without xdist, or a server the controller could not start) starts its own
once, when a test first asks. Tests that stop, pause or reconfigure a
server (three nodes, TLS and passwords, cephx, a paused OSD, the throwaway
servers' own tests) keep their own.

The prefix names the worker too: pytest 9.2 with pytest-xdist 3.8 drops
the groups above without a word (xdist marks a group in the node IDs,
which pytest 9.2 no longer reads from where xdist writes: pytest-xdist
issue 1386), so one module's tests may run on several workers at once, each
worker with its own node agents "a" and "b". tests/requirements.txt pins
pytest 9.1.1, where the groups hold; the worker in the prefix keeps the
modules apart should they not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared_servers import (
    ControllerServers,
    PrefixedCeph,
    PrefixedEtcd,
    module_prefix,
    shared_ceph_reach,
    shared_etcd_endpoints,
)

CONTROLLER_SERVERS = pytest.StashKey[ControllerServers]()


def _runs_cassandra(item: pytest.Item) -> bool:
    if item.path.stem.startswith("test_cassandra") or item.path.stem == "test_scylla_dialect":
        return True
    callspec = getattr(item, "callspec", None)  # test_node_cache's backends, one parameter each
    return callspec is not None and "cassandra" in callspec.params.values()


def _group(item: pytest.Item) -> str:
    """The test's xdist group: one of the two Cassandra groups (the node
    cache's tests on Cassandra, and the rest); else its file's, per backend
    where a module-scoped ``backend`` fixture is parametrized (test_node_cache's
    backends took 278 s on one worker, its module-scoped servers starting
    once per backend either way)."""
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("backend") if callspec is not None else None
    if _runs_cassandra(item):
        return "cassandra-node-cache" if backend == "cassandra" else "cassandra"
    return item.path.stem if backend is None else f"{item.path.stem}:{backend}"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item)))


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
    from dbwrap_py.adapters.cassandra import client as cc
    from dbwrap_py.testing.servers.cassandra import CassandraCluster

    with CassandraCluster(nodes=1) as cluster:
        yield cluster
    cc.close_all()


@pytest.fixture(scope="module")
def shared_cassandra(cassandra_server: Any, request: pytest.FixtureRequest) -> Keyspaced:
    """The shared Cassandra in a keyspace named after the test module."""
    return Keyspaced(cassandra_server, "t_" + request.module.__name__.rsplit(".", 1)[-1])


def _may_select_server_tests(config: pytest.Config) -> bool:
    """Whether ``-m`` lets a test marked ``server`` run (without ``-m``: yes)."""
    markexpr = config.getoption("markexpr", "")
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # pytest moved it: start them, as if it could
        return True
    return Expression.compile(markexpr).evaluate(lambda name, **_: name == "server")


def _hands_out_tests(config: pytest.Config) -> bool:
    """Whether this is a pytest-xdist controller that will start workers
    (the test pytest-xdist itself makes before it registers its controller)."""
    if hasattr(config, "workerinput") or config.getoption("collectonly", False):
        return False
    return config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))


def pytest_configure(config: pytest.Config) -> None:
    """The controller of a pytest-xdist run starts the shared etcd and Ceph
    (see the module docstring)."""
    if not _hands_out_tests(config) or not _may_select_server_tests(config):
        return
    servers = ControllerServers()
    config.stash[CONTROLLER_SERVERS] = servers
    servers.start()
    for error in servers.errors:
        config.issue_config_time_warning(
            pytest.PytestWarning(f"no shared {error}; each worker starts its own"), stacklevel=2)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_configure_node(node: Any) -> None:
    servers = node.config.stash.get(CONTROLLER_SERVERS, None)
    if servers is not None:
        node.workerinput.update(servers.workerinput)


def pytest_unconfigure(config: pytest.Config) -> None:
    servers = config.stash.get(CONTROLLER_SERVERS, None)
    if servers is not None:
        servers.stop()


def _workerinput(config: pytest.Config) -> dict[str, Any]:
    return dict(getattr(config, "workerinput", {}))


def _prefix(request: pytest.FixtureRequest) -> str:
    worker = str(_workerinput(request.config).get("workerid", ""))
    return module_prefix(request.module.__name__, worker)


@pytest.fixture(scope="session")
def etcd_server(pytestconfig: pytest.Config) -> Iterator[str]:
    """The run's one-node throwaway etcd, its endpoints (see the module docstring)."""
    endpoints = shared_etcd_endpoints(_workerinput(pytestconfig))
    if endpoints is not None:
        yield endpoints
        return
    from dbwrap_py.testing.servers.etcd import EtcdCluster

    with EtcdCluster(nodes=1) as cluster:
        yield cluster.endpoints


@pytest.fixture(scope="module")
def shared_etcd(etcd_server: str, request: pytest.FixtureRequest) -> PrefixedEtcd:
    """The shared etcd under a prefix named after the test module (and worker)."""
    return PrefixedEtcd(etcd_server, _prefix(request))


@pytest.fixture(scope="session")
def ceph_server(pytestconfig: pytest.Config) -> Iterator[dict[str, str]]:
    """The run's one-OSD throwaway Ceph, the rados adapter's options that
    reach it (conf, pool; see the module docstring)."""
    pytest.importorskip("rados")
    reach = shared_ceph_reach(_workerinput(pytestconfig))
    if reach is not None:
        yield reach
        return
    from dbwrap_py.testing.servers.rados import CephCluster

    with CephCluster(osds=1) as cluster:
        yield cluster.options()


@pytest.fixture(scope="module")
def shared_ceph(ceph_server: dict[str, str], request: pytest.FixtureRequest) -> PrefixedCeph:
    """The shared Ceph, its objects under a prefix named after the test module (and worker)."""
    return PrefixedCeph(ceph_server, _prefix(request))
