"""The fdb adapter: FoundationDB (or the model of it). ``adapter.py`` is the adapter proper;
the dotted name ``dbwrap_py.adapters.fdb`` names it too."""

from dbwrap_py.adapters.fdb.adapter import ADAPTER

__all__ = ["ADAPTER"]
