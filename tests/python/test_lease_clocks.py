"""Leases are judged by the store, not by comparing clocks.

One process (forked) has its Python clocks moved an hour ahead, as a host
whose clock is wrong would see the world. With sqlite_leased, whose leases
SQLite judges inside its own statements, it still waits for a lock another
process holds, and processes with both clocks increment a counter under the
lock with never two holders at once.

The broken example ``dbwrap_py_fixtures.client_clock_leased`` judges expiry
with the client's clock (the old way); the same checks must see two holders
there, so they are known to catch it.

A note on what moves: SQLite runs inside each client process and reads the
host's clock, so the processes sharing a file (WAL: one host) share that
clock. What differs between clients is their own notion of time, moved here.
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

import pytest

from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import FencedOut

from test_etcd import Child

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

SKEW = 3600.0
#: far longer than any test here: only a wrong judgement ends one early
LEASE = "30"
HOLD = 1.0
KEY = b"counter"
SQLITE_LEASED = "sqlite_leased"
CLIENT_CLOCK = "dbwrap_py_fixtures.client_clock_leased"


def open_db(adapter: str, name: str) -> Database:
    return open_database(name, 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, adapter,
                         [f"lease={LEASE}", "op_timeout=20"])


def move_clocks_ahead(seconds: float = SKEW) -> None:
    """Every Python clock of this process, ``seconds`` ahead (a forked child only)."""
    for name in ("time", "monotonic"):
        real = getattr(time, name)
        setattr(time, name, lambda real=real: real() + seconds)
    real_ns = time.time_ns
    time.time_ns = lambda: real_ns() + int(seconds * 1e9)


def waits_for_held_lock(adapter: str, name: str) -> bool:
    """The parent holds the lock for HOLD seconds; a child with its clock
    ahead tries to take it. Whether it waited until the parent let go."""
    db = open_db(adapter, name)
    db.lock(KEY)

    def skewed(ch: Child) -> str:
        move_clocks_ahead()
        mine = open_db(adapter, name)
        ch.send(("trying",))
        mine.lock(KEY)
        ch.send(("taken",))
        mine.unlock(KEY)
        mine.close()
        return "done"

    child = Child(skewed)
    assert child.recv() == ("trying",)
    readable, _, _ = select.select([child._from_child], [], [], HOLD)
    db.unlock(KEY)
    assert child.recv() == ("taken",)
    assert child.result() == "done"
    db.close()
    return not readable


def count_under_lock(adapter: str, name: str, skewed: list[bool], rounds: int = 60) -> tuple[int, int, int]:
    """Processes increment one counter under the lock, some with clocks ahead.
    Each marks its time holding the lock with a file only one can create.
    (final counter, times two held it at once, writes refused by the fence)."""
    marker = name + ".holder"
    db = open_db(adapter, name)
    db.lock(KEY)
    db.unlock(KEY, b"0")

    def work(ahead: bool):
        def run(ch: Child) -> tuple[int, int]:
            if ahead:
                move_clocks_ahead()
            mine = open_db(adapter, name)
            overlaps = fenced = 0
            for _ in range(rounds):
                value = mine.lock(KEY)
                try:
                    alone = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    overlaps += 1  # someone else holds the lock right now
                    alone = -1
                time.sleep(0.002)  # a holder does some work
                if alone >= 0:
                    os.close(alone)
                    os.unlink(marker)
                try:
                    mine.unlock(KEY, b"%d" % (int(value) + 1))
                except FencedOut:
                    fenced += 1
                time.sleep(0.002)  # and between holds, so that every process gets its turns
            mine.close()
            return overlaps, fenced
        return run

    children = [Child(work(ahead)) for ahead in skewed]
    results = [child.result() for child in children]
    final = int(db.fetch(KEY))
    db.close()
    return final, sum(r[0] for r in results), sum(r[1] for r in results)


def test_a_clock_ahead_waits_for_a_held_lock(tmp_path):
    assert waits_for_held_lock(SQLITE_LEASED, str(tmp_path / "db.tdb")), \
        "the process whose clock is ahead took a lock another process held"


def test_no_two_holders_with_clocks_apart(tmp_path):
    skewed = [False, True, False, True]
    final, overlaps, fenced = count_under_lock(SQLITE_LEASED, str(tmp_path / "db.tdb"), skewed)
    assert (overlaps, fenced) == (0, 0)
    assert final == 60 * len(skewed), "an increment was lost"


def test_the_checks_catch_leases_judged_by_the_client_clock(tmp_path):
    """The broken example: the skewed process takes the held lock at once,
    and the processes hold the lock together."""
    assert not waits_for_held_lock(CLIENT_CLOCK, str(tmp_path / "one.tdb"))
    final, overlaps, fenced = count_under_lock(CLIENT_CLOCK, str(tmp_path / "two.tdb"), [False, True, False, True])
    print(f"client clocks: {overlaps} times two holders, {fenced} writes fenced, counter {final} of 240")
    assert overlaps > 0, "two holders at once were not seen"


@pytest.mark.parametrize("adapter", [SQLITE_LEASED, CLIENT_CLOCK])
def test_without_skew_both_exclude(adapter, tmp_path):
    """The broken example is broken by the clocks alone: with one clock it excludes."""
    final, overlaps, fenced = count_under_lock(adapter, str(tmp_path / "db.tdb"), [False, False], rounds=40)
    assert (final, overlaps, fenced) == (80, 0, 0)
