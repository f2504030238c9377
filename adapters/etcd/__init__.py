"""The etcd adapter: etcd v3, through its JSON gateway. ``adapter.py`` is the adapter proper;
the dotted name ``dbwrap_py.adapters.etcd`` names it too."""

from dbwrap_py.adapters.etcd.adapter import ADAPTER

__all__ = ["ADAPTER"]
