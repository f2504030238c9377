"""Clusters for the cross-node and node-death tests, one per configuration
and module.

Each starts three ctdbds and three smbds (about 10 s), and with an adapter
its throwaway server and, with the node cache, a node agent per node. A
fixture's cluster must leave no process behind: its finalizer checks, by
PID, that every process the cluster had before stop() is gone after it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest

from dbwrap_py.cluster.processes import still_running
from dbwrap_py.cluster.replicas import CassandraNodes, CephOsds, EtcdMembers
from dbwrap_py.cluster.samba_cluster import (LOCKING_DATABASES, PERSISTENT_HANDLE_DATABASES, ClusterSetup,
                                             SambaCluster, persistent_handle_setup)

sys.path.insert(0, os.path.dirname(__file__))  # smb_client, cross_node, node_death

from node_death import Crash, node_one_dies  # noqa: E402  (found through the path above)

NODE_LOCAL_OPENS = ("smbXsrv_open_global.tdb",)  # as in the seed talks

#: the configurations every cross-node check must pass on
CONFIGURATIONS = {
    "ctdb": ClusterSetup(),
    # ctdb with sticky records on the locking databases (bench cluster's second reference line)
    "ctdb-sticky": ClusterSetup(ctdb_sticky=LOCKING_DATABASES),
    "etcd": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS),
    "etcd-node-cache": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                    adapter_options={"node_cache": "yes"}),
    # proxy mode: a node daemon per node, smbd reaching the node cache's records itself
    "etcd-proxy-node-cache": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                          adapter_options={"node_cache": "yes", "transport": "proxy",
                                                           "proxy_fastpath": "yes"}),
    **{f"{name}{suffix}": ClusterSetup(adapter=adapter, databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                       adapter_options={**options, **cache})
       for name, adapter, options in (("rados", "rados", {}), ("cassandra", "cassandra", {}),
                                      # the model of FoundationDB: no FoundationDB can run here
                                      ("fdb-model", "fdb", {"fdb_library": "model"}))
       for suffix, cache in (("", {}), ("-node-cache", {"node_cache": "yes"}))},
}
#: broken on purpose: each node keeps its own share modes, byte-range locks and leases
BROKEN = ClusterSetup(node_local=LOCKING_DATABASES)

#: seconds: the node-death configurations' leases (etcd's lease_ttl, the node
#: agents' --ttl), short so that a dead node's records are free in seconds
LEASE = 2
_SHORT = {"lease_ttl": str(LEASE)}
#: the configurations whose node 1 dies (test_node_death.py)
KILL_CONFIGURATIONS = {
    "ctdb": ClusterSetup(),
    "etcd": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                         adapter_options=_SHORT),
    "etcd-node-cache": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                    adapter_options={**_SHORT, "node_cache": "yes"}, node_lease_ttl=LEASE),
    "etcd-write-through": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                       adapter_options={**_SHORT, "node_cache": "write-through"},
                                       node_lease_ttl=LEASE),
    # the other adapters name their record locks' lease "lease"
    **{f"{name}{suffix}": ClusterSetup(adapter=adapter, databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                       adapter_options={**options, "lease": str(LEASE), **cache},
                                       node_lease_ttl=LEASE)
       for name, adapter, options in (("rados", "rados", {}), ("cassandra", "cassandra", {}),
                                      ("fdb-model", "fdb", {"fdb_library": "model"}))
       for suffix, cache in (("", {}), ("-node-cache", {"node_cache": "yes"}))},
}
#: broken on purpose: the node agents' lease is far longer than the LEASE
#: the checks hold the configuration to, so a dead node's records stay its own
LEASE_OUTLIVES_PROMISE = ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                      adapter_options={**_SHORT, "node_cache": "yes"}, node_lease_ttl=60)

#: the configurations a persistent handle must move to a survivor on
#: (Samba 4.25; test_persistent_failover.py): ctdb, which pushes each
#: persistent record to every node, and the databases of persistent handles
#: on a replicated backend
PERSISTENT_CONFIGURATIONS = {
    "ctdb": persistent_handle_setup(),
    "etcd": persistent_handle_setup("etcd", node_cache=""),
    "etcd-node-cache": persistent_handle_setup("etcd"),
    "etcd-write-through": persistent_handle_setup("etcd", node_cache="write-through"),
    **{f"{adapter}-node-cache": persistent_handle_setup(adapter) for adapter in ("rados", "cassandra")},
    # three replicas, one of which dies with node 1 (replicas.py)
    "etcd-node-cache-member-lost": persistent_handle_setup("etcd", replicas=EtcdMembers),
    "rados-node-cache-osd-lost": persistent_handle_setup("rados", replicas=CephOsds),
    # record locks of 6 s: with a node just lost, a Cassandra LWT here took
    # over 2 s, a copy's transaction lock expired before its commit, and
    # node 3's open failed with NT_STATUS_INTERNAL_DB_ERROR instead of being
    # refused for the reserved handle (1 run of 5, twice)
    "cassandra-node-cache-node-lost": persistent_handle_setup("cassandra", lock_lease=6,
                                                              replicas=CassandraNodes),
}


@contextmanager
def _running(setup: ClusterSetup) -> Iterator[SambaCluster]:
    """The cluster of ``setup`` while the fixture lasts; then stopped, and
    none of its processes left running."""
    if os.geteuid() != 0:
        pytest.skip("smbd and ctdbd need root")
    with SambaCluster(setup) as running:
        found = " ".join(running.processes().values())
        assert "ctdbd" in found and "smbd" in found, f"the cluster's processes are not found: {found}"
        yield running
        processes = running.processes()
    left = still_running(processes)
    assert not left, f"the cluster's processes outlived its stop(): {left}"


@pytest.fixture(scope="module", params=list(CONFIGURATIONS))
def cluster(request: pytest.FixtureRequest) -> Iterator[SambaCluster]:
    with _running(CONFIGURATIONS[request.param]) as running:
        yield running


#: the configurations a node joins and leaves (test_membership.py): each
#: with a spare fourth node, listed in ctdb's nodes file, not started
MEMBERSHIP_CONFIGURATIONS = {name: dataclasses.replace(CONFIGURATIONS[name], spare_nodes=1)
                             for name in ("ctdb", "ctdb-sticky", "etcd-node-cache")}


@pytest.fixture(scope="module", params=list(MEMBERSHIP_CONFIGURATIONS))
def membership_cluster(request: pytest.FixtureRequest) -> Iterator[SambaCluster]:
    with _running(MEMBERSHIP_CONFIGURATIONS[request.param]) as running:
        yield running


@pytest.fixture(scope="module")
def broken_cluster() -> Iterator[SambaCluster]:
    with _running(BROKEN) as running:
        yield running


@pytest.fixture(scope="module", params=list(KILL_CONFIGURATIONS))
def crash(request: pytest.FixtureRequest) -> Iterator[Crash]:
    """A cluster of its own whose node 1 has just died (node_death.py)."""
    with _running(KILL_CONFIGURATIONS[request.param]) as running:
        yield node_one_dies(running, LEASE)


@pytest.fixture(scope="module")
def crash_outliving_its_lease() -> Iterator[Crash]:
    with _running(LEASE_OUTLIVES_PROMISE) as running:
        yield node_one_dies(running, LEASE)


#: broken on purpose: the write-back node cache claims to write records
#: through and keeps them on the node (dbwrap_py.testing.skips_write_through),
#: so the persistent open dies with node 1: the test must fail on it
PERSISTENT_BROKEN = {
    "etcd-node-cache-skips-write-through": ClusterSetup(
        adapter="dbwrap_py.testing.skips_write_through", databases=PERSISTENT_HANDLE_DATABASES,
        adapter_options={**_SHORT, "node_cache": "yes"}, node_lease_ttl=LEASE, persistent_handles=True),
}


def _chosen(names: Iterable[str]) -> list[str]:
    """``names``, or those of them PERSISTENT_CONFIGS (comma-separated
    configuration names, exactly) lists; an unknown name is an error."""
    wanted = [n for n in os.environ.get("PERSISTENT_CONFIGS", "").split(",") if n]
    known = [*PERSISTENT_CONFIGURATIONS, *PERSISTENT_BROKEN]
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise pytest.UsageError(f"PERSISTENT_CONFIGS names {', '.join(unknown)}; known: {', '.join(known)}")
    return [n for n in names if not wanted or n in wanted]


@pytest.fixture(params=[*_chosen(PERSISTENT_CONFIGURATIONS), *(
    pytest.param(name, marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                               reason="broken on purpose: the persistent open dies with its node"))
    for name in _chosen(PERSISTENT_BROKEN))])
def persistent_cluster(request: pytest.FixtureRequest) -> Iterator[SambaCluster]:
    """A cluster of its own per test (its node 1 dies in it). A test that
    failed gets every node's smbd log tail, and the backend's, printed."""
    with _running({**PERSISTENT_CONFIGURATIONS, **PERSISTENT_BROKEN}[request.param]) as running:
        yield running
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for pnn, samba in enumerate(running.sambas):
                print(f"\n--- node {pnn + 1}'s smbd log ends ---\n{samba.log_tail(60)}", file=sys.stderr)
            print(f"\n--- the backend now ---\n{running.backend_report()}", file=sys.stderr)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Each phase's report on its test (rep_setup, rep_call), for fixtures' teardown."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


_RECLAIM_TIMES: dict[str, list[float]] = {}


@pytest.fixture
def reclaim_times() -> dict[str, list[float]]:
    """Seconds from node 1's kill to the reclaimed handle, per configuration
    (test_persistent_failover.py); the terminal summary gives median and worst."""
    return _RECLAIM_TIMES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _RECLAIM_TIMES:
        return
    terminalreporter.section("persistent handle: kill to reclaim, seconds")
    terminalreporter.write_line(f"{'configuration':<24} {'runs':>4} {'median':>7} {'worst':>7}")
    for name, times in _RECLAIM_TIMES.items():
        terminalreporter.write_line(f"{name:<24} {len(times):>4} {statistics.median(times):>7.1f} "
                                    f"{max(times):>7.1f}")
