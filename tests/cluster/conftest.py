"""Clusters for the cross-node tests, one per configuration and module.

Each starts three ctdbds and three smbds (about 10 s), and with an adapter
its throwaway server and, with the node cache, a node agent per node.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from dbwrap_py.cluster.samba_cluster import LOCKING_DATABASES, ClusterSetup, SambaCluster

sys.path.insert(0, os.path.dirname(__file__))  # smb_client, cross_node

NODE_LOCAL_OPENS = ("smbXsrv_open_global.tdb",)  # as in the seed talks

#: the configurations every cross-node check must pass on
CONFIGURATIONS = {
    "ctdb": ClusterSetup(),
    "etcd": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS),
    "etcd-node-cache": ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                    adapter_options={"node_cache": "yes"}),
    **{f"{name}{suffix}": ClusterSetup(adapter=adapter, databases=LOCKING_DATABASES, node_local=NODE_LOCAL_OPENS,
                                       adapter_options={**options, **cache})
       for name, adapter, options in (("rados", "rados", {}), ("cassandra", "cassandra", {}),
                                      # the model of FoundationDB: no FoundationDB can run here
                                      ("fdb-model", "fdb", {"fdb_library": "model"}))
       for suffix, cache in (("", {}), ("-node-cache", {"node_cache": "yes"}))},
}
#: (configuration, check) that do not pass yet, and why: strict, so a fix shows
KNOWN_GAPS: dict[tuple[str, str], str] = {}

#: broken on purpose: each node keeps its own share modes, byte-range locks and leases
BROKEN = ClusterSetup(node_local=LOCKING_DATABASES)


@pytest.fixture(scope="module", params=list(CONFIGURATIONS))
def cluster(request: pytest.FixtureRequest) -> Iterator[SambaCluster]:
    if os.geteuid() != 0:
        pytest.skip("smbd and ctdbd need root")
    with SambaCluster(CONFIGURATIONS[request.param]) as running:
        yield running


@pytest.fixture(scope="module")
def broken_cluster() -> Iterator[SambaCluster]:
    if os.geteuid() != 0:
        pytest.skip("smbd and ctdbd need root")
    with SambaCluster(BROKEN) as running:
        yield running
