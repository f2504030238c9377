"""The retry service (dbwrap_py.retry): its backoff and its deadline, on an
injected clock, wait and random source (no wall clock)."""

from __future__ import annotations

import random

import pytest

from dbwrap_py.errors import Timeout
from dbwrap_py.retry import DEFAULT, JITTER_LOW, UNTIL_WOKEN, Backoff, retry_until


class FakeTime:
    """A clock that moves only when waited on; records the waits asked for."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.waits: list[float] = []
        self.tries_at: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        assert seconds > 0
        self.waits.append(seconds)
        self.now += seconds


def run(t: FakeTime, deadline: float, backoff: Backoff = DEFAULT, rand=lambda: 1.0) -> list[int]:
    """Every try until the deadline (none succeeds); the try numbers seen."""
    seen = []
    for tries in retry_until(deadline, backoff, wait=t.wait, clock=t.clock, rand=rand):
        t.tries_at.append(t.now)
        seen.append(tries)
    return seen


def test_pauses_double_from_first_up_to_the_cap() -> None:
    t = FakeTime()
    run(t, t.now + 10.0, Backoff(first=0.01, cap=0.16))  # jitter factor 1: the steps themselves
    assert t.waits[:5] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16])
    assert set(t.waits[5:-1]) == {0.16}  # capped from there on


def test_jitter_stays_within_half_the_step_and_the_step() -> None:
    t, backoff = FakeTime(), Backoff(first=0.001, cap=0.05)
    run(t, t.now + 5.0, backoff, rand=random.Random(7).random)
    for tries, pause in enumerate(t.waits[:-1], start=1):
        assert JITTER_LOW * backoff.step(tries) <= pause <= backoff.step(tries)
        assert pause <= backoff.cap
    assert len(set(t.waits[5:-1])) > 1  # the factor does vary


def test_no_wait_goes_past_the_deadline_and_the_last_try_is_at_it() -> None:
    t = FakeTime()
    deadline = t.now + 1.0
    run(t, deadline, Backoff(first=0.3, cap=0.3))
    assert t.waits == pytest.approx([0.3, 0.3, 0.3, 0.1])  # the last wait is what was left
    assert t.tries_at[-1] == pytest.approx(deadline)
    assert all(at <= deadline + 1e-9 for at in t.tries_at)


def test_it_stops_after_the_try_at_the_deadline_and_the_caller_raises() -> None:
    t = FakeTime()

    def take_lock() -> None:
        for _ in retry_until(t.now + 0.5, Backoff(0.125, 0.125), wait=t.wait, clock=t.clock, rand=lambda: 1.0):
            t.tries_at.append(t.now)
        raise Timeout("db.tdb: record lock not free within 0.5 s")

    with pytest.raises(Timeout, match="db.tdb: record lock not free within 0.5 s"):
        take_lock()
    assert t.tries_at == [100.0, 100.125, 100.25, 100.375, 100.5]  # binary fractions: exact
    assert len(t.waits) == 4  # none after the last try


def test_a_deadline_already_past_still_gets_one_try_and_no_wait() -> None:
    t = FakeTime()
    assert run(t, t.now - 1.0) == [1]
    assert t.waits == []


def test_tries_are_numbered_and_a_success_ends_the_waiting() -> None:
    t = FakeTime()
    seen = []
    for tries in retry_until(t.now + 10.0, wait=t.wait, clock=t.clock, rand=lambda: 1.0):
        seen.append(tries)
        if tries == 3:
            break
    assert seen == [1, 2, 3]
    assert len(t.waits) == 2  # between the tries only


def test_a_wait_woken_early_keeps_the_backoff_and_the_deadline() -> None:
    t = FakeTime()
    asked: list[float] = []

    def woken(seconds: float) -> None:  # a watch fires at once: no time passes
        asked.append(seconds)

    tries = 0
    for tries in retry_until(t.now + 1.0, Backoff(0.01, 0.04), wait=woken, clock=t.clock, rand=lambda: 1.0):
        if tries == 5:
            t.now += 2.0  # the store is slow: the deadline passes during this try
    assert tries == 5
    assert asked == pytest.approx([0.01, 0.02, 0.04, 0.04])


def test_until_woken_waits_all_that_is_left_each_time() -> None:
    t = FakeTime()
    asked: list[float] = []

    def woken_after_a_quarter(seconds: float) -> None:
        asked.append(seconds)
        t.now += 0.25

    for _ in retry_until(t.now + 1.0, UNTIL_WOKEN, wait=woken_after_a_quarter, clock=t.clock, rand=lambda: 0.0):
        pass
    assert asked == [1.0, 0.75, 0.5, 0.25]


def test_a_backoff_must_have_0_lt_first_le_cap() -> None:
    for first, cap in ((0.0, 1.0), (0.2, 0.1), (-1.0, 1.0)):
        with pytest.raises(ValueError, match="first <= cap"):
            Backoff(first, cap)
