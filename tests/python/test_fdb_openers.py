"""TDB_CLEAR_IF_FIRST on the fdb adapter, run on the model of FoundationDB
(results of ``fdb (model)``, not of FoundationDB): a join far from the
store while other processes renew their opener keys, and the races a join
must still lose against a wipe.

``bench cluster --workload own-files --network multi-region`` at 64 clients
failed on node 2 (15 ms from the backend): a join read the whole openers
range into its read-conflict range, so every other process's join, renewal
(every 3.3 s each) or close that committed during its four round trips
(120 ms there) voided it, and its retries ran out of the 5 s transaction
timeout (1031). A join that finds a live opener needs to conflict only with
a wipe; a wipe still conflicts with any join.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dbwrap_py.adapters.fdb import library
from dbwrap_py.adapters.fdb.library import base_store_args, open_store
from dbwrap_py.adapters.fdb.store import FdbStore, prefix_end
from dbwrap_py.options import Options
from dbwrap_py.testing.fdb_model import _wire
from dbwrap_py.testing.fdb_model.throwaway import DESCRIPTION, model_server

pytestmark = pytest.mark.server

#: node 2's one-way delay to the backend on the multi-region profile
ONE_WAY = 0.015


@pytest.fixture(scope="module")
def near() -> Iterator[Path]:
    """A model server on TCP (as a networked cluster reaches it)."""
    with model_server(host="127.0.0.1") as path:
        yield path


@contextlib.contextmanager
def far_away(cluster_file: Path, one_way: float, folder: Path) -> Iterator[Path]:
    """A cluster file naming a relay that holds every chunk ``one_way``
    seconds each way on its path to the model server of ``cluster_file``."""
    target = _wire.parse_cluster_text(cluster_file.read_text())
    listener = socket.create_server(("127.0.0.1", 0))
    sockets: list[socket.socket] = []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(1 << 16):
                time.sleep(one_way)
                dst.sendall(chunk)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            server = socket.create_connection(target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sockets.append(s)
            threading.Thread(target=pump, args=(client, server), daemon=True).start()
            threading.Thread(target=pump, args=(server, client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    far = folder / "far.cluster"
    far.write_text(_wire.cluster_text(DESCRIPTION, listener.getsockname()))
    try:
        yield far
    finally:
        listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.close()


def store_on(cluster_file: Path, name: bytes) -> FdbStore:
    """A volatile database's store, not joined yet (the default 5 s transaction timeout)."""
    fdb = library.load("model", library.DEFAULT_API_VERSION)
    args = base_store_args(Options({"fdb_library": "model", "cluster_file": str(cluster_file)}))
    return open_store(fdb, {**args, "db": name, "volatile": True, "join": False})


def test_a_join_15_ms_away_is_not_voided_by_other_openers_renewing(near: Path, tmp_path: Path) -> None:
    """Eight processes' opener keys renewed about 150 times a second in
    all (64 smbd children renew one every 50 ms per database; their joins
    come in bursts); a join 15 ms from the store finds them live, must not
    wipe, and must not be retried out of its 5 s. Before the fix: Timeout
    ``open (TDB_CLEAR_IF_FIRST): ... transaction timed out (1031) (retries
    exhausted)``, as on node 2."""
    name = b"far-join"
    openers = [store_on(near, name) for _ in range(8)]
    for store in openers:
        store.join_openers()
    writer = store_on(near, name)
    writer.run("seed", lambda tr, _: writer.write_record(tr, b"k", b"kept"))
    stop = threading.Event()

    def renew(store: FdbStore) -> None:
        while not stop.wait(0.05):
            store.renew_opener()

    renewers = [threading.Thread(target=renew, args=(s,), daemon=True) for s in openers]
    for thread in renewers:
        thread.start()
    try:
        with far_away(near, ONE_WAY, tmp_path) as far:
            joiner = store_on(far, name)
            started = time.monotonic()
            joiner.join_openers()
            took = time.monotonic() - started
    finally:
        stop.set()
        for thread in renewers:
            thread.join()
    assert not joiner.wiped, "live openers: the join must not wipe"
    assert writer.get(b"k")[0] == b"kept"
    # four round trips of 30 ms, and little more: no retry ran out the clock
    assert took < 2.0, f"the join took {took:.2f} s"
    joiner.close()
    writer.close()
    for store in openers:
        store.close()


class Interleaved:
    """A database whose transactions run ``between()`` once, right after
    the first read of the openers range (snapshot or not) by this store."""

    def __init__(self, db: Any, openers: bytes, between: Callable[[], None]) -> None:
        self.db, self.openers, self.between = db, openers, between
        self.pending = True

    def create_transaction(self) -> Any:
        return _Tr(self.db.create_transaction(), self)


class _Reads:
    def __init__(self, reads: Any, owner: Interleaved) -> None:
        self._reads, self._owner = reads, owner

    def get_range(self, begin: bytes, end: bytes, *args: Any, **kwargs: Any) -> Any:
        result = list(self._reads.get_range(begin, end, *args, **kwargs))
        if begin == self._owner.openers and self._owner.pending:
            self._owner.pending = False
            self._owner.between()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reads, name)


class _Tr(_Reads):
    def __init__(self, tr: Any, owner: Interleaved) -> None:
        super().__init__(tr, owner)
        self.snapshot = _Reads(tr.snapshot, owner)


def wipes(store: FdbStore) -> int:
    raw = store.run("wipe key", lambda tr, _: tr.get(store.wipe_key).wait())
    return int.from_bytes(bytes(raw.value), "big") if raw.present() else 0


def test_a_join_that_saw_a_live_opener_loses_to_a_wipe_committed_meanwhile(near: Path) -> None:
    """B is the only opener; J's join reads it live, then, before J commits,
    B closes and C opens and wipes. J must not count as a plain join of the
    database as it was: its retry sees C live, does not wipe, and gets C's
    wipe revision; and C's wipe did not clear J's opener key."""
    name = b"join-vs-wipe"
    b = store_on(near, name)
    b.join_openers()
    c = store_on(near, name)
    j = store_on(near, name)

    def b_leaves_and_c_wipes() -> None:
        b.close()
        c.join_openers()

    j.db = Interleaved(j.db, j.openers, b_leaves_and_c_wipes)
    j.join_openers()
    assert c.wiped and not j.wiped
    assert j.wipe_revision == c.wipe_revision == wipes(c)
    keys = c.run("openers", lambda tr, _: [bytes(kv.key) for kv in tr.get_range(c.openers, prefix_end(c.openers))])
    assert sorted(keys) == sorted([c.openers + c.owner, j.openers + j.owner])
    j.close()
    c.close()


def test_a_wipe_loses_to_a_join_committed_meanwhile(near: Path) -> None:
    """Nobody has the database open; W's join reads no live opener, then,
    before W commits, J opens (and wipes, being first). W must not wipe J's
    records or its opener key: its retry sees J live."""
    name = b"wipe-vs-join"
    w = store_on(near, name)
    j = store_on(near, name)

    def j_opens_and_writes() -> None:
        j.join_openers()
        j.run("write", lambda tr, _: j.write_record(tr, b"k", b"j's"))

    w.db = Interleaved(w.db, w.openers, j_opens_and_writes)
    w.join_openers()
    assert j.wiped and not w.wiped
    assert w.get(b"k")[0] == b"j's"
    assert w.wipe_revision == j.wipe_revision
    w.close()
    j.close()
