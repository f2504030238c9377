"""Clients on different nodes of a three-node cluster see each other's
share modes, byte-range locks, oplocks and opens: on ctdb, and on every
adapter with a server here, without and with the node cache. A cluster
whose nodes keep their locking databases to themselves must fail every one
of the same checks."""

from __future__ import annotations

import pytest

from cross_node import BLIND, CHECKS, sticky_databases


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_nodes_see_each_other(cluster, check):
    check(cluster)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_a_cluster_with_node_local_locking_fails_the_check(broken_cluster, check):
    with pytest.raises(AssertionError, match=BLIND[check]):
        check(broken_cluster)


def test_ctdb_keeps_sticky_records_on_every_node_exactly_where_told(cluster):
    """ctdb_sticky reaches every node's ctdbd (setdbsticky goes to one
    node only); plain ctdb, the reference, has none (its default)."""
    if cluster.setup.adapter is not None:
        pytest.skip("ctdb keeps no locking database here")
    for pnn in range(len(cluster.sambas)):
        assert sticky_databases(cluster, pnn) == set(cluster.setup.ctdb_sticky), f"node {pnn}"
