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


class BackendReplicas(abc.ABC):
    """Three replicas of a backend while the ``with`` block lasts."""

    #: what one lost replica is called in a test's output
    replica: str = "replica"

    @abc.abstractmethod
    def __enter__(self) -> "BackendReplicas":
        """Start them; every replica answers when this returns."""

    @abc.abstractmethod
    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Stop every replica left, by PID."""

    @abc.abstractmethod
    def options(self) -> dict[str, str]:
        """The adapter's options that reach every replica."""

    @abc.abstractmethod
    def lose_one(self) -> None:
        """SIGKILL one replica: a crash, not a clean leave."""


class EtcdMembers(BackendReplicas):
    """Three etcd members; the adapter is given all three endpoints. etcd's
    own heartbeat and election timeouts (100 ms, 1 s), not the throwaway
    server's quick ones: beside a busy cluster on 2 cores those saw the
    first request time out in a leader election."""

    replica = "etcd member"

    def __enter__(self) -> "EtcdMembers":
        from dbwrap_py.adapters._etcd_server import EtcdCluster

        self._cluster = EtcdCluster(nodes=3, heartbeat_ms=100, election_ms=1000).__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cluster.__exit__(kind, value, tb)

    def options(self) -> dict[str, str]:
        return {"endpoints": self._cluster.endpoints}

    def lose_one(self) -> None:
        self._cluster.stop_member(0, signal.SIGKILL)


class CephOsds(BackendReplicas):
    """One mon and three OSDs, the pool of size 3 and min_size 2."""

    replica = "Ceph OSD"

    def __enter__(self) -> "CephOsds":
        from dbwrap_py.adapters._rados_server import CephCluster

        self._cluster = CephCluster(osds=3).__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cluster.__exit__(kind, value, tb)

    def options(self) -> dict[str, str]:
        return self._cluster.options()

    def lose_one(self) -> None:
        self._cluster.stop_daemon("osd.0", signal.SIGKILL)


class CassandraNodes(BackendReplicas):
    """Three Cassandra nodes, the keyspace at replication factor 3: the
    adapter's QUORUM and SERIAL reads and writes need two of them."""

    replica = "Cassandra node"

    def __enter__(self) -> "CassandraNodes":
        from dbwrap_py.adapters._cassandra_server import CassandraCluster

        self._cluster = CassandraCluster(nodes=3).__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cluster.__exit__(kind, value, tb)

    def options(self) -> dict[str, str]:
        return self._cluster.options()

    def lose_one(self) -> None:
        self._cluster.stop_node(0, signal.SIGKILL)
