"""The one-node etcd and Ceph the test modules share, and each module's
part of them (tests/python/conftest.py says when they start, and why).

A module sees a shared server through its own prefix: the etcd and rados
adapters put every key or object of theirs under option ``prefix`` (the
records, locks, node leases, node registrations and release requests:
adapters/etcd/keys.py, adapters/rados/adapter.py, adapters/rados/ownership.py),
so two modules that both name their node agents "a" and "b" never meet.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

#: workerinput keys: what the pytest-xdist controller hands its workers
ETCD_KEY = "dbwrap_py_etcd"  # the shared etcd's endpoints
CEPH_KEY = "dbwrap_py_ceph"  # the shared Ceph's rados options (conf, pool), as JSON


def module_prefix(module_name: str, worker: str) -> str:
    """The prefix of a test module's keys or objects on one pytest-xdist
    worker (``gw0``; "" without xdist): ``t_test_etcd_gw0``. The worker is
    in it because one module's tests may run on several workers at once
    (see conftest.py), and each worker starts its own node agents "a" and "b"."""
    return "t_" + module_name.rsplit(".", 1)[-1] + (f"_{worker}" if worker else "")


@dataclasses.dataclass(frozen=True)
class PrefixedEtcd:
    """A shared etcd as one module sees it."""

    endpoints: str
    prefix: str

    def options(self) -> dict[str, str]:
        return {"endpoints": self.endpoints, "prefix": self.prefix}


@dataclasses.dataclass(frozen=True)
class PrefixedCeph:
    """A shared Ceph as one module sees it: its objects are named
    ``<prefix>/...`` in the cluster's one pool."""

    reach: Mapping[str, str]  # conf and pool
    prefix: str

    def options(self) -> dict[str, str]:
        return {**self.reach, "prefix": self.prefix}


class ControllerServers:
    """The etcd and the Ceph a pytest-xdist controller starts for its
    workers, by the throwaway servers' own classes (stopped by PID).

    A server that cannot start (not installed, no rados module) is left
    out, with the reason in ``errors``: a worker that needs it then starts
    its own, and the test that needs it fails or skips as it would alone.
    """

    def __init__(self) -> None:
        self._servers: list[Any] = []  # EtcdCluster, CephCluster
        self.workerinput: dict[str, str] = {}
        self.errors: list[str] = []

    def start(self) -> None:
        from dbwrap_py.servers import ServerError

        try:
            from dbwrap_py.testing.servers.etcd import EtcdCluster

            etcd = EtcdCluster(nodes=1)
            etcd.start()
            self._servers.append(etcd)
            self.workerinput[ETCD_KEY] = etcd.endpoints
        except ServerError as exc:
            self.errors.append(f"etcd: {exc}")
        try:
            from dbwrap_py.testing.servers.rados import CephCluster

            ceph = CephCluster(osds=1)
            ceph.start()
            self._servers.append(ceph)
            self.workerinput[CEPH_KEY] = json.dumps(ceph.options())
        except ServerError as exc:
            self.errors.append(f"Ceph: {exc}")

    def stop(self) -> None:
        while self._servers:
            self._servers.pop().stop()
        self.workerinput = {}


def shared_etcd_endpoints(workerinput: Mapping[str, Any]) -> str | None:
    endpoints = workerinput.get(ETCD_KEY)
    return str(endpoints) if endpoints else None


def shared_ceph_reach(workerinput: Mapping[str, Any]) -> dict[str, str] | None:
    reach = workerinput.get(CEPH_KEY)
    return dict(json.loads(reach)) if reach else None
