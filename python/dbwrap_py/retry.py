"""Trying again until a deadline: the one retry loop, with the one backoff policy.

A caller that tries something until it works or a deadline passes writes

    for _ in retry_until(deadline):
        if try_it():
            return
    raise Timeout("<database>: <operation> ... because ...")

``retry_until`` yields once per try and waits between two tries; after the
try made at (or just past) the deadline it stops, and the code after the
loop raises the caller's own typed error. Leaving the loop (``return``,
``break``, an exception) ends the retries.

The backoff policy: the pause before try ``n + 1`` is ``first * 2**n``,
capped at ``cap``, times a random factor in [0.5, 1] (jitter: clients that
retry in step keep contending, e.g. on one Paxos instance), and never
longer than what is left until the deadline, so the last try is made at it.
The first try is made at once, even with the deadline already past.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator

#: the jitter: a pause is its step times a factor in [JITTER_LOW, 1]
JITTER_LOW = 0.5


@dataclasses.dataclass(frozen=True)
class Backoff:
    """The backoff's two numbers (seconds): the first step and the cap."""

    first: float = 0.001
    cap: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"backoff: need 0 < first <= cap, got first={self.first} cap={self.cap}")

    def step(self, tries: int) -> float:
        """The pause before try ``tries + 1``, before jitter: doubled per try, capped."""
        return min(self.cap, self.first * 2.0 ** min(tries - 1, 64))

    def pause(self, tries: int, rand: float) -> float:
        """``step`` times a jitter factor; ``rand`` in [0, 1)."""
        return self.step(tries) * (JITTER_LOW + (1.0 - JITTER_LOW) * rand)


#: 1 ms doubling to 50 ms: waiting for a lock another process holds
DEFAULT = Backoff()
#: for a waiter the store wakes (a watch): each wait may last until the deadline
UNTIL_WOKEN = Backoff(math.inf, math.inf)


def retry_until(deadline: float, backoff: Backoff = DEFAULT, *,
                wait: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic,
                rand: Callable[[], float] = random.random) -> Iterator[int]:
    """Yield the number of the try about to be made (1, 2, ...), and wait
    between two tries as ``backoff`` says, never past ``deadline`` (a
    ``clock()`` reading). ``wait(seconds)`` is the waiting, a sleep unless
    the caller can be woken sooner (a watch); it may return early. Stops
    after the first try that began at or past the deadline."""
    tries = 1
    while True:
        yield tries
        left = deadline - clock()
        if left <= 0:
            return
        wait(min(backoff.pause(tries, rand()), left))
        tries += 1
