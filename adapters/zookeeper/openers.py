"""TDB_CLEAR_IF_FIRST in zookeeper: the store's side of a volatile database's
openers (``dbwrap_py.openers``, which owns the first-open test's order, the
leave on close and what a forked child does with its parent's openers).

An opener is an ephemeral znode of this process's session under
``base/o``, so a killed opener's goes with its session and nothing is
renewed (``ttl`` None). The database's znodes live in a generation,
``base/g<n>``, named in ``base/o``'s data. The open is atomic
(``open_atomically``): each opener rewrites that data on the version it
read and creates its znode in one multi, so of two first openers (no
znode under ``base/o``) only one starts the next generation, which is the
wipe; the other tries again and joins it. An opener that may wipe then
removes the older generations. docs/adapters/zookeeper.md.
"""

from __future__ import annotations

import os
import time

from kazoo.exceptions import NoNodeError

from dbwrap_py.adapters.zookeeper.client import Session
from dbwrap_py.errors import Timeout, Unavailable
from dbwrap_py.openers import OPENERS, Registration
from dbwrap_py.retry import retry_until

#: a persistent database's folder: it has no openers and no generations
PERSISTENT = "p"


def next_generation(data: bytes | None) -> str:
    """The generation after ``data``'s (``g<n>``; counted from 1)."""
    number = (data or b"")[1:]
    return f"g{int(number) + 1 if number.isdigit() and len(number) < 9 else 1}"


class ZkOpeners:
    """One volatile database's openers (a ``dbwrap_py.openers.AtomicOpenerStore``);
    ``generation``: the one the open found or started."""

    ttl: float | None = None  # an ephemeral znode goes with its session: nothing to renew

    def __init__(self, session: Session, base: str) -> None:
        self.session, self.base, self.folder = session, base, f"{base}/o"
        self.pid = os.getpid()  # in the opener's name, for whoever lists base/o
        self.generation = ""

    def __repr__(self) -> str:
        return f"zookeeper openers of {self.base}"

    def path(self, opener: int) -> str:
        return f"{self.folder}/{self.pid}.{opener:x}"

    def open_atomically(self, opener: int, clear_if_first: bool) -> bool:
        """Join the current generation, or start the next one if first; a
        race for ``base/o``'s version just tries again, until op_timeout."""
        self.session.ensure(self.folder)
        for _ in retry_until(time.monotonic() + self.session.config.op_timeout):
            data, version = self.session.get_versioned(self.folder)
            first = clear_if_first and not self.session.children(self.folder)
            generation = next_generation(data) if first or not data else data.decode()
            if self.session.multi([("set", self.folder, generation.encode(), version),
                                   ("create", self.path(opener), b"", True)]) is None:
                self.generation = generation
                if clear_if_first:
                    self._remove_old_generations()
                return first
        raise Timeout(f"zookeeper: could not join the openers of {self.folder} "
                      f"within {self.session.config.op_timeout:g} s")

    def _remove_old_generations(self) -> None:
        """Every generation but ours, best effort."""
        for old in set(self.session.children(self.base)) - {"o", self.generation}:
            self.session.remove_tree(f"{self.base}/{old}")

    def register(self, opener: int) -> None:
        """Create the opener's znode if it is not there (the service never
        renews it: ``ttl`` is None)."""
        self.session.create_all([("create", self.path(opener), b"", True)], "registering an opener")

    def unregister(self, opener: int) -> None:
        """Delete the opener's znode (gone already: its session's end took it)."""
        failed = self.session.multi([("delete", self.path(opener))])
        if failed is not None and not isinstance(failed[1], NoNodeError):
            raise Unavailable(f"zookeeper: deleting opener {self.path(opener)}: {failed[1]!r}")


def open_root(session: Session, base: str, persistent: bool, may_wipe: bool,
              covers_children: bool = False) -> tuple[str, Registration | None]:
    """(the folder a database's znodes live in, this opener's registration).
    A persistent database's is ``base/p``, with no opener; a volatile one's
    is its openers' generation (``OPENERS.open``): the first opener, if
    ``may_wipe``, starts a new one (TDB_CLEAR_IF_FIRST's wipe).
    ``covers_children``: this process's forked children are openers through
    the registration, and open with no round trip here (no join, no wipe)."""
    registration, generation = None, PERSISTENT
    if not persistent:
        store = ZkOpeners(session, base)
        registration = OPENERS.open(store, clear_if_first=may_wipe, covers_children=covers_children)
        generation = store.generation
    root = f"{base}/{generation}"
    session.ensure(*(f"{root}/{folder}" for folder in "dlfs"))
    return root, registration
