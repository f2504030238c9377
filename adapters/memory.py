"""An in-process dict: the counterpart of Samba's rbt backend.

It exists to measure what the bridge and the framework cost on their own, so
every method is as short as it can be.

* Each open is a fresh, empty dict, even for a name that is already open in
  this process, exactly like ``db_open_rbt()``: nothing is shared between
  opens and nothing survives ``close``.
* One process only. Record locks are no-ops: the framework already counts
  re-entrant holds, and there is no other process to exclude.
* Transactions are one level deep (the framework does the nesting). The
  adapter journals the old value of each key on its first write inside the
  transaction, so cancel restores exactly those keys and commit just drops
  the journal.
* ``seqnum`` is a counter bumped on every put, remove, commit and wipe. It
  never goes back, not even on cancel: a reader that saw an uncommitted
  value must see the number change again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from dbwrap_py.adapter import Adapter, Capabilities, DatabaseSpec
from dbwrap_py.errors import NotSupported
from dbwrap_py.options import Options

_MISSING = object()
_serial = itertools.count(1)


class MemoryAdapter(Adapter):
    capabilities = Capabilities(
        transactions=True,
        multi_process=False,
        lock_release_seconds=0.0,
        notes=(
            "single process: every open is a fresh, private dict (like rbt)",
            "record locks are no-ops",
        ),
    )

    def __init__(self, spec: DatabaseSpec, options: Options) -> None:
        super().__init__(spec, options)
        self._data: dict[bytes, bytes] = {}
        self._journal: dict[bytes, object] | None = None  # key -> old value or _MISSING
        self._seqnum = 0
        self._id = f"memory:{next(_serial)}:{spec.name}".encode("utf-8", "surrogateescape")

    # -- records ----------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def exists(self, key: bytes) -> bool:
        return key in self._data

    def put(self, key: bytes, value: bytes) -> None:
        journal = self._journal
        if journal is not None and key not in journal:
            journal[key] = self._data.get(key, _MISSING)
        self._data[key] = bytes(value)
        self._seqnum += 1

    def remove(self, key: bytes) -> bool:
        old = self._data.pop(key, _MISSING)
        if old is _MISSING:
            return False
        journal = self._journal
        if journal is not None and key not in journal:
            journal[key] = old
        self._seqnum += 1
        return True

    def scan(self) -> Iterator[tuple[bytes, bytes]]:
        # A snapshot, so a caller may write while it walks.
        return iter(list(self._data.items()))

    def lock(self, key: bytes) -> None:
        pass

    def unlock(self, key: bytes) -> None:
        pass

    # -- database-wide ----------------------------------------------------

    def seqnum(self) -> int:
        return self._seqnum

    def transaction_start(self, nonblock: bool = False) -> None:
        if self._journal is not None:
            raise NotSupported("memory adapter: a transaction is already running")
        self._journal = {}

    def transaction_commit(self) -> None:
        if self._journal is None:
            raise NotSupported("memory adapter: commit without a transaction")
        self._journal = None
        self._seqnum += 1

    def transaction_cancel(self) -> None:
        journal = self._journal
        if journal is None:
            raise NotSupported("memory adapter: cancel without a transaction")
        self._journal = None
        data = self._data
        for key, old in journal.items():
            if old is _MISSING:
                data.pop(key, None)
            else:
                data[key] = old  # type: ignore[assignment]

    def wipe(self) -> None:
        journal = self._journal
        if journal is not None:
            for key, old in self._data.items():
                journal.setdefault(key, old)
        self._data.clear()
        self._seqnum += 1

    def check(self) -> None:
        pass

    def db_id(self) -> bytes:
        # Two opens of one name are two databases, so the id names the open.
        return self._id

    def close(self) -> None:
        self._data = {}
        self._journal = None


ADAPTER = MemoryAdapter
