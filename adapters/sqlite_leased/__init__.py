"""The sqlite_leased adapter: one sqlite file shared by every node, with leased record locks. ``adapter.py`` is the adapter proper;
the dotted name ``dbwrap_py.adapters.sqlite_leased`` names it too."""

from dbwrap_py.adapters.sqlite_leased.adapter import ADAPTER

__all__ = ["ADAPTER"]
