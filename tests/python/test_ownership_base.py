"""The generic half of the adapters' ownership modules
(python/dbwrap_py/nodecache/ownership_base.py), without a store."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import pytest

from dbwrap_py.errors import LockConflict, Timeout
from dbwrap_py.nodecache import ownership_base as ob
from dbwrap_py.nodecache.protocol import Claim, OwnedElsewhere, Taken


@pytest.mark.parametrize("bits", [32, ob.TOKEN_BITS])
def test_tokens_after_a_wipe_are_above_its_revision_and_those_before_not(bits: int) -> None:
    for generation in range(4):
        revision = ob.wipe_revision(generation, bits)
        before = [ob.new_token(g, bits) for g in range(generation) for _ in range(50)]
        after = [ob.new_token(generation, bits) for _ in range(50)]
        assert all(token <= revision for token in before)
        assert all(token > revision for token in after)
        assert {ob.generation_of(token, bits) for token in after} == {generation}
    assert ob.wipe_revision(0, bits) == 0


def test_a_holder_mark_names_its_node_and_lease() -> None:
    mark = ob.holder_mark(b"node-1:a", 0xBEEF)
    assert mark == b"node-1:a:beef"
    assert ob.parse_holder_mark(mark) == (b"node-1:a", 0xBEEF)
    assert ob.parse_holder_mark(b"") == (b"", 0)


def test_attempts_give_one_turn_at_least_then_time_out_naming_what() -> None:
    turns = 0
    with pytest.raises(Timeout, match="take b'k': its row kept changing for 0 s"):
        for _ in ob.attempts(0.0, "take b'k': its row"):
            turns += 1
    assert turns == 1


def test_a_grant_returns_the_first_true_answer() -> None:
    answers = iter([0, 0, 7])
    assert ob.grant_retrying(b"n", lambda: next(answers), 60.0, 10.0) == 7


def test_a_grant_refused_past_its_time_names_the_node() -> None:
    tries = []
    with pytest.raises(LockConflict, match="node name 'n' is registered by a live agent"):
        ob.grant_retrying(b"n", lambda: tries.append(1), 0.0, 0.0, "is registered by a live agent")
    assert tries == [1]


def test_new_requests_yields_each_standing_request_once_and_one_asked_again() -> None:
    rounds: list[dict[Hashable, tuple[bytes, bytes] | None]] = [
        {1: (b"db", b"a"), 2: (b"db", b"b"), "junk": None},
        {1: (b"db", b"a"), 3: (b"db", b"b")},  # b asked again: a new identity
        {3: (b"db", b"b")},
        {1: (b"db", b"a")},  # a served, then asked again with its old identity
    ]
    stop = threading.Event()
    waits = []

    def read() -> dict[Hashable, tuple[bytes, bytes] | None]:
        found = rounds.pop(0)
        if not rounds:
            stop.set()
        return found

    got = list(ob.new_requests(read, lambda: waits.append(1), stop))
    assert got == [(b"db", b"a"), (b"db", b"b"), (b"db", b"b"), (b"db", b"a")]
    assert len(waits) == 4


def test_per_database_opens_each_once_and_hands_them_over_to_close() -> None:
    opened: list[bytes] = []
    cache = ob.PerDatabase(lambda db_id: opened.append(db_id) or [db_id])
    assert cache(b"x") is cache(b"x")
    cache(b"y")
    assert opened == [b"x", b"y"]
    assert sorted(cache.take_all()) == [[b"x"], [b"y"]]
    cache(b"x")
    assert opened == [b"x", b"y", b"x"]


def test_a_called_ownership_turns_plain_answers_into_the_protocol() -> None:
    answers: dict[str, Any] = {
        "take": ob.taken(b"v", 5, True), "claim": (9, {b"k": b"v"}), "owners": [b"a", b"b"],
        "write_back": 1, "owner": b"a"}
    calls: list[tuple[Any, ...]] = []

    def call(method: str, *args: Any) -> Any:
        calls.append((method, *args))
        return answers.get(method)

    ownership = ob.CalledOwnership(call, 3.0)
    assert ownership.take(b"k", b"n", 1) == Taken(b"v", 5, via_bucket=True)
    assert ownership.claim(2, b"n", 1) == Claim(9, {b"k": b"v"})
    assert ownership.owners() == frozenset({b"a", b"b"})
    assert ownership.write_back(b"k", None, 5, True, b"n", 1) is True
    assert ownership.owner(b"k") == b"a"
    answers["take"], answers["claim"] = ob.elsewhere(b"m", "b'k' is node m's"), None
    with pytest.raises(OwnedElsewhere, match="node m's") as refused:
        ownership.take(b"k", b"n", 1)
    assert refused.value.node == b"m"
    assert ownership.claim(2, b"n", 1) is None
    assert ("write_back", b"k", None, 5, True, b"n", 1) in calls
