"""The tdb adapter: Samba's own tdb, through libtdb (the C extension _tdb). ``adapter.py`` is the adapter proper;
the dotted name ``dbwrap_py.adapters.tdb`` names it too."""

from dbwrap_py.adapters.tdb.adapter import ADAPTER

__all__ = ["ADAPTER"]
