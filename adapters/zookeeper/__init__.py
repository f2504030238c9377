"""The zookeeper adapter: ZooKeeper through kazoo; sessions are the leases.
``adapter.py`` is the adapter proper; the dotted name
``dbwrap_py.adapters.zookeeper`` names it too."""

from dbwrap_py.adapters.zookeeper.adapter import ADAPTER

__all__ = ["ADAPTER"]
