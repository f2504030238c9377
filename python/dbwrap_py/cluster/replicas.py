"""A backend of three replicas for the cluster rig, one of which a test
loses together with a Samba node (``ClusterSetup.replicas``).

The adapters' throwaway servers run one replica; these run three, with a
quorum (etcd's raft; Cassandra's QUORUM at replication factor 3) or a
replicated pool (Ceph: size 3, min_size 2) that keeps serving with one of
them gone. Losing one is a SIGKILL by PID.
"""

from __future__ import annotations

import abc
import signal
from types import TracebackType
from typing import Any


class BackendReplicas(abc.ABC):
    """Three replicas of a backend while the ``with`` block lasts, run by
    one of the throwaway servers' cluster classes (``cluster()``), which
    stops them by PID."""

    #: what one lost replica is called in a test's output
    replica: str = "replica"

    @abc.abstractmethod
    def cluster(self) -> Any:
        """The throwaway cluster of three, not started yet."""

    @abc.abstractmethod
    def lose_one(self) -> None:
        """SIGKILL one replica: a crash, not a clean leave."""

    def __enter__(self) -> "BackendReplicas":
        """Start them; every replica answers when this returns."""
        self._cluster = self.cluster().__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cluster.__exit__(kind, value, tb)

    def options(self) -> dict[str, str]:
        """The adapter's options that reach every replica."""
        return self._cluster.options()


class EtcdMembers(BackendReplicas):
    """Three etcd members; the adapter is given all three endpoints. etcd's
    own heartbeat and election timeouts (100 ms, 1 s), not the throwaway
    server's quick ones: beside a busy cluster on 2 cores those saw the
    first request time out in a leader election."""

    replica = "etcd member"

    def cluster(self) -> Any:
        from dbwrap_py.testing.servers.etcd import EtcdCluster

        return EtcdCluster(nodes=3, heartbeat_ms=100, election_ms=1000)

    def options(self) -> dict[str, str]:
        return {"endpoints": self._cluster.endpoints}

    def lose_one(self) -> None:
        self._cluster.stop_member(0, signal.SIGKILL)


class CephOsds(BackendReplicas):
    """One mon and three OSDs, the pool of size 3 and min_size 2."""

    replica = "Ceph OSD"

    def cluster(self) -> Any:
        from dbwrap_py.testing.servers.rados import CephCluster

        return CephCluster(osds=3)

    def lose_one(self) -> None:
        self._cluster.stop_daemon("osd.0", signal.SIGKILL)


class CassandraNodes(BackendReplicas):
    """Three Cassandra nodes, the keyspace at replication factor 3: the
    adapter's QUORUM and SERIAL reads and writes need two of them."""

    replica = "Cassandra node"

    def cluster(self) -> Any:
        from dbwrap_py.testing.servers.cassandra import CassandraCluster

        return CassandraCluster(nodes=3)

    def lose_one(self) -> None:
        self._cluster.stop_node(0, signal.SIGKILL)
