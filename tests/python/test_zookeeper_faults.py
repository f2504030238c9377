"""The zookeeper adapter on a throwaway ensemble of three ZooKeeper servers:
the leader SIGKILLed under a concurrent increment load loses no
acknowledged increment, and the survivors elect another.

Each writer process increments counters as smbd changes a record: lock it
(read it), write the value plus one and unlock in one step
(``Database.unlock(key, value)``, the adapter's put_unlock). An increment
whose unlock returned is *acknowledged*. One whose unlock raised may or
may not have landed (a reply lost with its connection), so for every
counter: acknowledged <= final value <= acknowledged + unacknowledged
attempts. A writer whose increment is lost (two holders at once, a fence
that let a stale holder write, a reply that said done for a write that
did not land) makes the final value fall below the acknowledged count: the
broken writer below, which reads under one lock and writes under another,
shows the check catches that, and test_the_check_is_strict_both_ways that
a failed attempt counted as acknowledged would be caught too.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import DbwrapError
from dbwrap_py.testing.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.server

RW = os.O_RDWR | os.O_CREAT
KEYS = [b"counter-%d" % i for i in range(3)]
WORKERS = 3
SESSION = 4  # seconds: a session outlives the election (about 0.5 s here) and the reconnect
OP_TIMEOUT = 5.0
LOAD_SECONDS = 12.0  # each writer's run, bounded in time ...
MAX_ATTEMPTS = 5000  # ... and in attempts
KILL_AFTER = 3.0  # seconds into the load
RETRY_PAUSE = 0.05  # a writer's pause after an error, before it tries again


@pytest.fixture(scope="module")
def ensemble() -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(nodes=3) as zk:
        yield zk


def open_zk(hosts: str, path: str) -> Database:
    """A volatile database, as smbd's locking.tdb."""
    options = {"hosts": hosts, "session_timeout": str(SESSION), "op_timeout": str(OP_TIMEOUT)}
    return open_database(path, 0, TDB_CLEAR_IF_FIRST, RW, 0o600, 0, 0, "zookeeper",
                         [f"{k}={v}" for k, v in options.items()])


@dataclasses.dataclass
class Tally:
    """One writer's count, per counter."""

    acked: Counter[bytes] = dataclasses.field(default_factory=Counter)  # the unlock returned
    unacked: Counter[bytes] = dataclasses.field(default_factory=Counter)  # the unlock raised: landed or not
    errors: Counter[str] = dataclasses.field(default_factory=Counter)  # by type, lock and unlock
    ack_times: list[float] = dataclasses.field(default_factory=list)  # time.monotonic() of each ack
    ack_keys: list[bytes] = dataclasses.field(default_factory=list)  # and its counter
    error_log: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (when, what)


def _increment(db: Database, key: bytes, tally: Tally, broken: bool) -> None:
    """One increment; raises what the lock or the unlock raised."""
    value = db.lock(key)
    if broken:  # reads under one lock, writes under another: increments get lost
        db.unlock(key)
        db.lock(key)
    new = b"%d" % (int(value or b"0") + 1)
    try:
        db.unlock(key, new)
    except DbwrapError:
        tally.unacked[key] += 1
        raise
    tally.acked[key] += 1
    tally.ack_times.append(time.monotonic())
    tally.ack_keys.append(key)


def _writer(hosts: str, path: str, stop_at: float, worker: int, broken: bool, results: Any) -> None:
    """A writer process: increments until ``stop_at`` or MAX_ATTEMPTS,
    trying again after each error; puts its Tally (or why it failed)."""
    tally = Tally()
    try:
        db = open_zk(hosts, path)
        for n in range(MAX_ATTEMPTS):
            if time.monotonic() >= stop_at:
                break
            try:
                _increment(db, KEYS[(worker + n) % len(KEYS)], tally, broken)
            except DbwrapError as exc:
                tally.errors[type(exc).__name__] += 1
                tally.error_log.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                time.sleep(RETRY_PAUSE)
        db.close()
    except BaseException as exc:  # the parent reports it
        results.put(f"writer {worker}: {type(exc).__name__}: {exc}")
        return
    results.put(tally)


def run_writers(zk: ZooKeeperServer, path: str, seconds: float, broken: bool = False,
                kill_leader_after: float | None = None) -> tuple[list[Tally], dict[str, float]]:
    """WORKERS writer processes for ``seconds``; with ``kill_leader_after``,
    the leader SIGKILLed that long into the load. (tallies, figures)."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    stop_at = time.monotonic() + seconds
    workers = [context.Process(target=_writer, args=(zk.hosts, path, stop_at, w, broken, results))
               for w in range(WORKERS)]
    for w in workers:
        w.start()
    figures: dict[str, float] = {}
    try:
        if kill_leader_after is not None:
            time.sleep(kill_leader_after)
            victim = zk.leader()
            assert victim is not None, f"no leader before the kill: {[zk.mode(i) for i in range(zk.nodes)]}"
            killed_at = time.monotonic()
            zk.kill_server(victim)  # SIGKILL by PID, mid-load
            new_leader, figures["leaderless_s"] = zk.wait_leader(timeout=30)
            figures.update(killed_at=killed_at, victim=victim, new_leader=new_leader)
        tallies = [results.get(timeout=seconds + 2 * OP_TIMEOUT + 30) for _ in workers]
    finally:
        for w in workers:
            w.join(10)
            if w.is_alive():  # by its PID
                w.kill()
                w.join(10)
    failed = [t for t in tallies if not isinstance(t, Tally)]
    assert not failed, failed
    return tallies, figures


def violations(tallies: Sequence[Tally], stored: Mapping[bytes, int]) -> list[str]:
    """Per counter: acknowledged <= stored <= acknowledged + unacknowledged."""
    found = []
    for key in KEYS:
        acked = sum(t.acked[key] for t in tallies)
        unacked = sum(t.unacked[key] for t in tallies)
        if not acked <= stored[key] <= acked + unacked:
            found.append(f"{key.decode()}: {acked} acknowledged, {unacked} unacknowledged, {stored[key]} stored")
    return found


def stored_counts(db: Database) -> dict[bytes, int]:
    return {key: int(db.fetch(key) or b"0") for key in KEYS}


def acks_after(tallies: Sequence[Tally], moment: float) -> dict[bytes, int]:
    """Increments acknowledged after ``moment``, per counter."""
    return {key: sum(1 for t in tallies for at, k in zip(t.ack_times, t.ack_keys) if k == key and at > moment)
            for key in KEYS}


def test_leader_killed_under_load_loses_no_acknowledged_increment(ensemble, tmp_path):
    path = str(tmp_path / "locking.tdb")
    keeper = open_zk(ensemble.hosts, path)  # keeps the database open: the writers join, no wipe
    tallies, figures = run_writers(ensemble, path, LOAD_SECONDS, kill_leader_after=KILL_AFTER)
    stored = stored_counts(keeper)
    killed_at = figures["killed_at"]
    acked = sum(sum(t.acked.values()) for t in tallies)
    unacked = sum(sum(t.unacked.values()) for t in tallies)
    errors = sum((t.errors for t in tallies), Counter())
    after = acks_after(tallies, killed_at)
    first_after = min((at for t in tallies for at in t.ack_times if at > killed_at), default=float("nan"))
    print(f"\n3 servers, the leader (server {int(figures['victim'])}) SIGKILLed {KILL_AFTER:g} s into "
          f"{LOAD_SECONDS:g} s of {WORKERS} writers on {len(KEYS)} counters:\n"
          f"  {acked} increments acknowledged, {unacked} unacknowledged (landed or not), stored "
          f"{sum(stored.values())} ({', '.join(f'{k.decode()} {v}' for k, v in stored.items())})\n"
          f"  without a leader for {figures['leaderless_s']:.2f} s (srvr, every 20 ms; then server "
          f"{int(figures['new_leader'])} led); the first increment after the kill acknowledged "
          f"{first_after - killed_at:.2f} s after it\n"
          f"  acknowledged after the kill, per counter: {', '.join(f'{k.decode()} {n}' for k, n in after.items())}\n"
          f"  errors: {dict(errors)}; the first: " + "; ".join(
              f"{at - killed_at:+.2f} s {what}" for at, what in sorted(e for t in tallies for e in t.error_log)[:4]))
    assert not violations(tallies, stored), violations(tallies, stored)
    assert sum(after.values()) > 0, "no increment acknowledged after the kill: two of three servers are a quorum"
    ensemble.start_server(int(figures["victim"]))  # the module's ensemble whole again
    keeper.close()
    # a take or release whose answer the kill lost must not leave its lock
    # behind, held by a live session until its process ends
    stuck = [k.decode() for k, n in after.items() if n == 0]
    assert not stuck, f"{', '.join(stuck)} never incremented after the kill: a lock stayed held"


def test_a_writer_that_loses_increments_fails_the_check(ensemble, tmp_path):
    """The broken example: reading under one lock and writing under another
    loses increments between writers, and the check says so."""
    path = str(tmp_path / "broken.tdb")
    keeper = open_zk(ensemble.hosts, path)
    tallies, _ = run_writers(ensemble, path, 4.0, broken=True)
    found = violations(tallies, stored_counts(keeper))
    print(f"\nbroken writers: {found}")
    assert found, "the check did not see the lost increments"
    keeper.close()


def test_the_check_is_strict_both_ways():
    """No server: an attempt that did not land, counted as acknowledged, is
    caught; one that landed without its reply is allowed; a stored value
    above every attempt is caught."""
    tally = Tally(acked=Counter({key: 10 for key in KEYS}), unacked=Counter({KEYS[0]: 1}))
    exact = {key: 10 for key in KEYS}
    assert violations([tally], exact) == []  # the unacknowledged one did not land
    assert violations([tally], {**exact, KEYS[0]: 11}) == []  # it landed
    assert violations([tally], {**exact, KEYS[0]: 12}) != []  # more than was attempted
    miscounted = Tally(acked=Counter({**tally.acked, KEYS[0]: 11}))  # the failed attempt counted as acknowledged
    assert violations([miscounted], exact) != []
