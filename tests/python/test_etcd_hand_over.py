"""etcd's hand-over (adapters/etcd/ownership.py ``hand_over``), below the
node cache: the write-back frees the record in the store, then a second
transaction puts the asking node's lock. Once the write-back committed
the record is no longer the holder's, whatever the second transaction
does: a failure there must not reach the node cache as an error, which
would leave the node serving, from its cache, a record the store has
given away. Against the run's shared etcd (conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dbwrap_py.adapters.etcd.adapter import EtcdAdapter
from dbwrap_py.adapters.etcd.ownership import EtcdOwnership
from dbwrap_py.errors import Unavailable
from dbwrap_py.options import Options

from test_etcd import open_etcd

pytestmark = pytest.mark.server


@pytest.fixture
def setting(shared_etcd, tmp_path) -> Iterator[tuple[EtcdOwnership, Any, Any, Any]]:
    """A volatile database's ownership operations, and nodes a and b's live leases."""
    db = open_etcd(shared_etcd, str(tmp_path / "locking.tdb"), volatile=True, lease_ttl="30")
    store = EtcdAdapter.node_store(Options({**shared_etcd.options(), "op_timeout": "3"}))
    a, b = store.grant(b"a", 30), store.grant(b"b", 30)
    yield db.adapter.ownership(), store, a, b
    for lease in (a, b):
        store.revoke(lease)
    store.close()
    db.close()


def test_a_hand_over_whose_second_transaction_fails_still_gives_the_record_back(setting):
    own, _store, a, b = setting
    held = own.take(b"k", b"a", a.id)
    own.request_release(b"k", b"a", b.id, requester=b"b")
    call, calls = own._call, []

    def second_fails(path: str, body: Any, idempotent: bool) -> dict[str, Any]:
        calls.append(path)
        if len(calls) == 2:
            raise Unavailable("etcd: no answer to the hand-over's second transaction")
        return call(path, body, idempotent)

    own._call = second_fails
    assert own.hand_over(b"k", b"v", held.token, False, b"a", a.id), \
        "the write-back committed: the node must forget the record"
    own._call = call
    assert len(calls) == 2, "the failure was not met after the write-back"
    assert own.owner(b"k") is None, "the record is free in the store (b's lock was never put)"
    taken = own.take(b"k", b"b", b.id)  # the asking node's next look takes it
    assert taken.value == b"v"
    own.let_go(b"k", b"a", a.id)  # a's agent, meeting the standing request for a record it no longer has
    assert own.owner(b"k") == b"b", "a's let_go took b's record"


def test_a_hand_over_refused_by_its_fence_is_no_hand_over(setting):
    """A hand-over on a token the store no longer honours commits nothing
    and says so (the node then forgets the record by its own fence): the
    True above means the write-back committed."""
    own, _store, a, b = setting
    held = own.take(b"k", b"a", a.id)
    own.write_back(b"k", b"v", held.token, False, b"a", a.id)
    own.take(b"k", b"b", b.id)
    assert not own.hand_over(b"k", b"stale", held.token, False, b"a", a.id)
    assert own.owner(b"k") == b"b"
