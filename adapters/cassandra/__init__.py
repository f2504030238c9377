"""The cassandra adapter: Apache Cassandra (and the scylla dialect, scylla.py). ``adapter.py`` is the adapter proper;
the dotted name ``dbwrap_py.adapters.cassandra`` names it too."""

from dbwrap_py.adapters.cassandra.adapter import ADAPTER

__all__ = ["ADAPTER"]
