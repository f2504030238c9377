"""The etcd adapter's waits between tries, without an etcd: they run on
dbwrap_py.retry (one backoff policy, never past the deadline) and end in
the project's typed errors."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from dbwrap_py.adapters.etcd.adapter import EtcdAdapter
from dbwrap_py.adapters.etcd.client import _b64
from dbwrap_py.adapters.etcd.keys import DatabaseKeys, node_marker
from dbwrap_py.adapters.etcd.locks import DETACH_WAIT, RecordLocks, Tries
from dbwrap_py.adapters.etcd.transactions import TransactionSteps
from dbwrap_py.errors import LockConflict, Timeout

KEYS = DatabaseKeys(b"p", b"db")


class Lockers(TransactionSteps):
    """The transaction steps over a fake etcd whose record locks are ``holders``'."""

    def __init__(self, holders: list[bytes]) -> None:
        self.keys, self._owner, self.config = KEYS, b"me", SimpleNamespace(op_timeout=0.1)
        self.holders, self.calls = holders, 0

    def _call(self, path: str, body: Mapping[str, Any], deadline: float, idempotent: bool) -> dict[str, Any]:
        self.calls += 1
        return {"kvs": [{"key": _b64(KEYS.lock(b"k%d" % i)), "value": _b64(h)} for i, h in enumerate(self.holders)]}


def test_waiting_for_record_lockers_gives_up_at_the_deadline_with_a_timeout() -> None:
    lockers = Lockers([b"me", b"another process"])
    started = time.monotonic()
    with pytest.raises(Timeout, match="record locks still held"):
        lockers.wait_for_record_lockers(1, False, started + 0.1)
    took = time.monotonic() - started
    assert 0.1 <= took < 0.1 + 0.5, "no pause runs past the deadline"
    assert lockers.calls >= 2, "tried at once and again at the deadline"


def test_waiting_for_record_lockers_returns_once_only_ours_are_left() -> None:
    lockers = Lockers([b"me"])
    lockers.wait_for_record_lockers(1, False, time.monotonic() + 10)
    assert lockers.calls == 1


def test_waiting_for_record_lockers_without_blocking_refuses_after_one_look() -> None:
    lockers = Lockers([b"another process"])
    with pytest.raises(LockConflict):
        lockers.wait_for_record_lockers(1, True, time.monotonic() + 10)
    assert lockers.calls == 1


class Claimed(RecordLocks):
    """A volatile database's record locks, whose record's bucket ``node`` claims."""

    spec = SimpleNamespace(persistent=False)

    def __init__(self) -> None:
        self.keys, self.asked = KEYS, []

    def _request_release(self, node: bytes, key: bytes, deadline: float) -> None:
        self.asked.append(node)


def refusal(node: bytes) -> dict[str, Any]:
    """etcd's reply to a take refused because ``node`` claims the bucket (not detached)."""
    claim = {"response_range": {"kvs": [{"value": _b64(node_marker(node, 7)), "create_revision": "3"}]}}
    return {"header": {"revision": "9"}, "responses": [{"response_range": {}}, claim, {"response_range": {}}]}


def test_a_record_its_node_owns_is_asked_for_once_and_waited_for_the_pause_it_is_given() -> None:
    locks = Claimed()
    tries = Tries(b"key", 1, time.monotonic() + 10)
    wait = locks._what_to_wait_for(tries, refusal(b"node-a"))
    started = time.monotonic()
    wait(0.05)
    assert time.monotonic() - started >= 0.05
    again = locks._what_to_wait_for(tries, refusal(b"node-a"))
    started = time.monotonic()
    again(0.0)
    assert time.monotonic() - started < 0.05, "the pause is the framework's backoff, not a fixed sleep"
    assert locks.asked == [b"node-a"]
    assert EtcdAdapter.lock_wait is DETACH_WAIT, "the leased loop's pauses are the etcd adapter's"
