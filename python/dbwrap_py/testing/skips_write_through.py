"""Broken on purpose: etcd behind a write-back node cache that never writes
a record through while the node owns it, the persistent records of Samba
4.25 included (``NodeCache.write_through_held``). The store says yes and
keeps nothing, so a persistent open lives only in its node's cache and
dies with it. tests/cluster/test_persistent_failover.py shows its failover
test failing on this adapter (``dbwrap_py:adapter =
dbwrap_py.testing.skips_write_through``)."""

from __future__ import annotations

from dbwrap_py.adapters.etcd.ownership import EtcdOwnership
from dbwrap_py.adapters.etcd.adapter import EtcdAdapter


class _SkippingOwnership(EtcdOwnership):
    def write_through(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        return True  # claimed, never written


class SkipsWriteThroughAdapter(EtcdAdapter):
    def ownership(self) -> EtcdOwnership:
        real = super().ownership()
        return _SkippingOwnership(real._call, real.keys, real.op_timeout)


ADAPTER = SkipsWriteThroughAdapter
