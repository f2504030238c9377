"""The rados adapter: Ceph RADOS omap objects. ``adapter.py`` is the adapter proper;
the dotted name ``dbwrap_py.adapters.rados`` names it too."""

from dbwrap_py.adapters.rados.adapter import ADAPTER

__all__ = ["ADAPTER"]
