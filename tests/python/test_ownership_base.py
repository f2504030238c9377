"""The generic half of the adapters' ownership modules
(python/dbwrap_py/nodecache/ownership_base.py), without a store."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import pytest

from dbwrap_py.errors import LockConflict, Timeout
from dbwrap_py.nodecache import ownership_base as ob
from dbwrap_py.nodecache.protocol import Claim, OwnedElsewhere, Served, Taken


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


def test_new_requests_yields_each_standing_request_once_one_asked_again_and_each_served() -> None:
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
    # a record's request gone from one round to the next is Served (the
    # agent stops counting it as pending); one asked again is not
    assert got == [(b"db", b"a"), (b"db", b"b"), (b"db", b"b"), Served(b"db", b"a"),
                   Served(b"db", b"b"), (b"db", b"a")]
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


def _take(answers: list[Any], standing: bool = True) -> tuple[Taken, list[ob.Held]]:
    """take_retrying over ``answers`` in turn; the holds it asked ``standing`` about."""
    asked: list[ob.Held] = []

    def is_standing(held: ob.Held) -> bool:
        asked.append(held)
        return standing

    return ob.take_retrying(b"k", b"me", 7, 5.0, "its row", lambda: answers.pop(0), is_standing), asked


def test_a_take_that_applies_is_its_answer_and_asks_about_no_hold() -> None:
    assert _take([ob.Refused(), Taken(b"v", 3)]) == (Taken(b"v", 3), [])


def test_a_take_meeting_its_own_hold_takes_it_as_found() -> None:
    own = ob.Held(b"me", 7, 99, via_bucket=True)
    assert _take([ob.Refused(b"v", own)]) == (Taken(b"v", 99, via_bucket=True), [])


def test_a_take_meeting_a_live_node_is_owned_elsewhere_and_a_dead_one_is_tried_again() -> None:
    other = ob.Held(b"other", 8, 5)
    with pytest.raises(OwnedElsewhere) as refused:
        _take([ob.Refused(b"v", other)])
    assert refused.value.node == b"other"
    assert _take([ob.Refused(b"v", other), Taken(b"v", 6)], standing=False) == (Taken(b"v", 6), [other])


def test_a_take_meeting_a_process_lock_is_refused_without_a_node() -> None:
    with pytest.raises(OwnedElsewhere, match="locked by a process") as refused:
        _take([ob.Refused(by_process=True)])
    assert refused.value.node is None


def test_live_owners_asks_once_and_not_at_all_for_nothing() -> None:
    asked: list[set[tuple[bytes, int]]] = []

    def live(found: set[tuple[bytes, int]]) -> list[bytes]:
        asked.append(found)
        return [node for node, lease in found if lease % 2]

    assert ob.live_owners([], live) == frozenset() and asked == []
    assert ob.live_owners([(b"a", 1), (b"a", 1), (b"b", 2)], live) == {b"a"}
    assert asked == [{(b"a", 1), (b"b", 2)}]


class _Steps(ob.ServedOwnership):
    """A ServedOwnership that records its steps (the rest of Ownership unused)."""

    def __init__(self, fenced: bool) -> None:
        self.fenced, self.steps = fenced, []  # type: ignore[var-annotated]

    def write_back_fenced(self, key: bytes, value: bytes | None, token: int, via_bucket: bool) -> bool:
        self.steps.append(("write back", key))
        return self.fenced

    def drop_lock(self, key: bytes, node: bytes, lease: int) -> None:
        self.steps.append(("drop", key))

    def served(self, node: bytes, key: bytes) -> None:
        self.steps.append(("served", node))

    take = claim = request_release = write_through = release_bucket = owner = None  # type: ignore[assignment]


@pytest.mark.parametrize("fenced", [True, False])
def test_a_write_back_and_a_let_go_end_with_the_request_served_either_way(fenced: bool) -> None:
    own = _Steps(fenced)
    assert own.write_back(b"k", b"v", 1, False, b"n", 2) is fenced
    own.let_go(b"k", b"n", 2)
    assert own.steps == [("write back", b"k"), ("served", b"n"), ("drop", b"k"), ("served", b"n")]
