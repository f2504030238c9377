"""Nodes joining and leaving a running cluster (SambaCluster.join_node and
leave_node, which make bench-elastic's events): a fourth node listed in
ctdb's nodes file but never started joins, and its clients see the other
nodes' share modes; a node that leaves cleanly is gone, every process by
PID, and the others go on serving. For ctdb and for etcd with the node
cache.
"""

from __future__ import annotations

import pytest

from cross_node import share_mode_conflict, sticky_databases
from dbwrap_py.cluster.ctdb import node_states
from dbwrap_py.cluster.processes import still_running
from dbwrap_py.cluster.samba_cluster import ClusterError, SambaCluster

pytestmark = pytest.mark.server

@pytest.fixture
def cluster(membership_cluster: SambaCluster) -> SambaCluster:
    """The module's cluster (conftest.py: MEMBERSHIP_CONFIGURATIONS); the
    tests run in order on it: the spare node joins, then node 2 leaves."""
    return membership_cluster


def test_a_spare_node_is_listed_but_not_running_until_it_joins(cluster):
    assert len(cluster.sambas) == 3 and len(cluster.ctdb.nodes) == 4
    states = node_states(cluster.ctdb.nodes[0].ctdb("status"))
    assert states[3].startswith("DISCONNECTED"), states
    with pytest.raises(ClusterError, match="the next spare node is 3"):
        cluster.join_node(2)


def test_a_joined_node_serves_and_sees_the_other_nodes_share_modes(cluster):
    cluster.join_node(3)
    states = node_states(cluster.ctdb.nodes[0].ctdb("status"))
    assert all(state.startswith("OK") for state in states.values()), states
    assert len(cluster.sambas) == 4
    if cluster.setup.ctdb_sticky:
        assert sticky_databases(cluster, 3) == set(cluster.setup.ctdb_sticky), "the joined node"
    if cluster.setup.adapter is not None:
        assert len(cluster.agents) == 4, "the joined node has no node agent"
    share_mode_conflict(cluster, holder=0, others=(3,))
    share_mode_conflict(cluster, holder=3, others=(0, 1))


def test_a_node_that_leaves_is_gone_and_the_others_serve(cluster):
    had = cluster.node_processes(2)
    assert had, "node 2 has no processes to stop"
    cluster.leave_node(2)
    assert not still_running(had), "a process of the node that left is still running"
    states = node_states(cluster.ctdb.nodes[0].ctdb("status"))
    assert not states[2].startswith("OK"), states
    share_mode_conflict(cluster, holder=1, others=(0, 3))
