"""Handle and traverse numbers: per connection, u32, never 0."""

from __future__ import annotations

from collections.abc import Container

U32_LIMIT = 0xFFFFFFFF


def next_id(used: Container[int], last: int) -> int:
    """The first u32 after ``last`` (wrapping, skipping 0) not in ``used``."""
    candidate = last
    while True:
        candidate = candidate % U32_LIMIT + 1
        if candidate not in used:
            return candidate
