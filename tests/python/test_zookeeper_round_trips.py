"""What moving a record between nodes costs on zookeeper, in round trips
(``Session.round_trips``: requests sent together count once): a node's
process whose key is in a bucket another node claimed tries the claim,
is refused the take, asks, and takes the record once handed over. Each
round trip waits on the server, which under 64 smbds' load (bench cluster
--workload own-files --nprocs 64) answered in 0.1-0.5 s; a record needed
by a process in locking.tdb and in brlock.tdb made that twice, and a
process of the 64 finished no open in its 5 s. Against a throwaway
ZooKeeper.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dbwrap_py.adapters.zookeeper.nodestore import ZkNodeStore
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.nodecache.protocol import OwnedElsewhere
from dbwrap_py.options import Options
from dbwrap_py.testing.servers.zookeeper import ZooKeeperServer

from test_zookeeper import OP_TIMEOUT, SESSION, open_zk

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def zk() -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer() as server:
        yield server


def test_a_key_of_another_nodes_bucket_is_asked_for_and_taken_in_few_round_trips(zk, tmp_path):
    agents = [ZkNodeStore(Options({"hosts": zk.hosts, "op_timeout": str(OP_TIMEOUT)})) for _ in range(2)]
    db = open_zk(zk.hosts, str(tmp_path / "trips.tdb"))
    try:
        a, b = (agent.grant(name, SESSION).id for agent, name in zip(agents, (b"a", b"b")))
        own = db.adapter.ownership()  # one process's, as the node cache keeps it
        session = db.adapter.zk
        held = own.claim(bucket_of(b"k"), b"a", a)  # node a's process made another file in the bucket
        assert held is not None

        before = session.round_trips
        assert own.claim(bucket_of(b"k"), b"b", b) is None
        with pytest.raises(OwnedElsewhere) as refused:
            own.take(b"k", b"b", b)
        assert refused.value.node == b"a"
        asked = session.round_trips - before
        assert asked <= 2, f"the claim tried and the take refused took {asked} round trips"

        own.request_release(b"k", b"a", b, requester=b"b")
        assert own.hand_over(b"k", b"v", held.token, True, b"a", a)  # as node a's agent would

        before = session.round_trips
        taken = own.take(b"k", b"b", b)
        assert (taken.value, taken.via_bucket) == (b"v", False)
        took = session.round_trips - before
        assert took == 1, f"the take of the record handed over took {took} round trips"
    finally:
        db.close()
        for agent in agents:
            agent.close()


@pytest.mark.parametrize("by_bucket", [False, True], ids=["record-lock", "bucket-claim"])
def test_a_request_sent_again_after_the_hand_over_landed_is_not_left_standing(zk, tmp_path, by_bucket):
    """A node's waiter asks again every ASK_AGAIN (0.25 s) while its takes
    are refused, and its request is sent unwaited. Under load a round trip
    took longer than that, so an ask sent again often landed after the
    hand-over had made the record the asker's: a request for a hold that had
    ended, which the holder's agent then spent a round trip on (``let_go``)
    while the requests of other waiters queued behind it. The request is
    made only while the hold that refused the take stands."""
    agents = [ZkNodeStore(Options({"hosts": zk.hosts, "op_timeout": str(OP_TIMEOUT)})) for _ in range(2)]
    db = open_zk(zk.hosts, str(tmp_path / "again.tdb"))
    try:
        a, b = (agent.grant(name, SESSION).id for agent, name in zip(agents, (b"a", b"b")))
        own = db.adapter.ownership()
        if by_bucket:
            claim = own.claim(bucket_of(b"k"), b"a", a)
            assert claim is not None
            token = claim.token
        else:
            token = own.take(b"k", b"a", a).token
        with pytest.raises(OwnedElsewhere):
            own.take(b"k", b"b", b)
        own.request_release(b"k", b"a", b, requester=b"b")
        assert own.request_waiting(b"k", b"a", b), "the hold stands: the request must be made"
        assert own.hand_over(b"k", b"v", token, by_bucket, b"a", a)
        assert not own.request_waiting(b"k", b"a", b)

        own.request_release(b"k", b"a", b, requester=b"b")  # the ask again, landing after the hand-over
        assert not own.request_waiting(b"k", b"a", b), "a request for a hold that ended stands"
        taken = own.take(b"k", b"b", b)
        assert (taken.value, taken.via_bucket) == (b"v", False)
    finally:
        db.close()
        for agent in agents:
            agent.close()
