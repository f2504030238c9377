"""The node cache's formats and rules: what Python writes, the C fast path reads.

The agent's state file is written by state.StateWriter (Python) and read by
_fastpath.State (C); local records and buckets are packed by layout.py and
judged by _fastpath.LocalRecords. These tests write with one and read with
the other, and check the rules LocalRecords owns: which record the node
owns, which key of its bucket is new, and how a write is fenced.
"""

from __future__ import annotations

import os
import time

import pytest

from dbwrap_py.errors import FencedOut
from dbwrap_py.nodecache._fastpath import LocalRecords, State
from dbwrap_py.nodecache.cache import local_files, open_local
from dbwrap_py.nodecache.layout import (
    DELETED,
    DETACHED,
    VIA_BUCKET,
    Bucket,
    Local,
    bucket_key,
    bucket_of,
)
from dbwrap_py.nodecache.state import StateWriter, record_hash

DB = b"locking.tdb@0123456789abcdef"


@pytest.fixture
def node(tmp_path):
    writer = StateWriter(tmp_path, b"node-a")
    writer.publish(0x1F, time.monotonic() + 30)
    state = State(tmp_path)
    records_path, buckets_path = local_files(tmp_path, DB)
    records, buckets = open_local(records_path), open_local(buckets_path)
    local = LocalRecords(records, buckets, state, DB, 0.2)
    yield writer, state, records, buckets, local
    records.close()
    buckets.close()
    state.close()
    writer.remove()


def test_the_state_python_writes_is_the_state_c_reads(node):
    writer, state, *_ = node
    assert state.current() == (0x1F, b"node-a")
    assert state.lease() == 0x1F and state.agent_pid() == os.getpid() and state.configured()
    writer.drain()
    assert state.current() == (0, b"") and state.lease() == 0x1F, "draining: no new records"
    writer.publish(0x1F, time.monotonic() - 1)
    assert state.lease() == 0, "a lease past its validity is not live"


def test_the_wanted_table_python_writes_is_the_table_c_reads(node):
    writer, state, *_ = node
    assert not state.wanted(DB, b"k")
    assert writer.want(DB, b"k")
    assert state.wanted(DB, b"k") and not state.wanted(DB, b"other")
    writer.unwant(DB, b"k")
    assert not state.wanted(DB, b"k")
    # many keys whose probes collide still find their own slot
    keys = [b"key-%d" % i for i in range(300)]
    assert all(writer.want(DB, k) for k in keys)
    assert all(state.wanted(DB, k) for k in keys)
    assert record_hash(DB, b"k") >> 63 == 1


def test_a_local_record_is_the_nodes_only_under_its_lease_and_after_the_wipe(node):
    _, _, records, _, local = node
    records.put(b"k", Local(0x1F, 40, 0, b"value").pack())
    assert local.owned(b"k", 0x1F) == (0x1F, 40, 0, b"value")
    assert local.owned(b"k", 0x20) is None, "another lease: not the node's"
    local.wipe_revision = 40
    assert local.owned(b"k", 0x1F) is None, "taken before the last wipe: void"
    local.wipe_revision = 0
    records.put(b"gone", Local(0x1F, 41, 0, None).pack())
    assert local.owned(b"gone", 0x1F) == (0x1F, 41, DELETED, None)


def test_a_key_of_the_nodes_bucket_is_new_unless_the_store_had_it(node):
    _, _, _, buckets, local = node
    number = bucket_of(b"fresh")
    stored = [k for k in (b"old-%d" % i for i in range(2000)) if bucket_of(k) == number][:2]
    buckets.put(bucket_key(number), Bucket(0x1F, 50, frozenset(stored)).pack())
    assert local.owned(b"fresh", 0x1F) == (0x1F, 50, VIA_BUCKET | DELETED, None)
    assert local.owned(stored[0], 0x1F) is None, "the store had it: moved in, not new"
    assert local.holds_bucket(b"fresh", 0x1F) == (50, False)
    assert local.holds_bucket(stored[1], 0x1F) == (50, True)
    assert local.holds_bucket(b"fresh", 0x20) is None
    local.forget(b"fresh", 0x1F)  # handed to another node: detached for good
    assert local.owned(b"fresh", 0x1F) is None
    assert Local.unpack(local_raw(node, b"fresh")).flags & DETACHED


def local_raw(node, key):
    return node[2].get(key)


def test_a_lock_stands_on_a_placeholder_and_writes_are_fenced_on_it(node):
    writer, _, records, buckets, local = node
    number = bucket_of(b"new")
    buckets.put(bucket_key(number), Bucket(0x1F, 60, frozenset()).pack())
    records.lock(b"new")
    assert local.stand(b"new", 0x1F) == (0x1F, 60, VIA_BUCKET | DELETED, None)
    assert records.get(b"new") is not None, "the placeholder is written"
    assert local.write(b"new", b"v1") is False, "it did not exist"
    assert local.owned(b"new", 0x1F)[3] == b"v1"
    writer.publish(0x20, time.monotonic() + 30)  # the agent has a new lease
    with pytest.raises(FencedOut):
        local.write(b"new", b"v2")
    writer.publish(0, 0.0)  # no live lease: the write waits, then is fenced
    started = time.monotonic()
    with pytest.raises(FencedOut):
        local.write(b"new", b"v3")
    assert time.monotonic() - started >= 0.2
    records.unlock(b"new")


def test_scans_list_what_the_node_owns(node):
    _, _, records, buckets, local = node
    records.put(b"mine", Local(0x1F, 70, VIA_BUCKET, b"x").pack())
    records.put(b"old", Local(0x0E, 71, 0, b"y").pack())
    records.put(b"detached", Local(0x1F, 72, DETACHED, None).pack())
    buckets.put(bucket_key(3), Bucket(0x1F, 80, frozenset()).pack())
    buckets.put(bucket_key(4), Bucket(0x0E, 81, frozenset()).pack())
    assert local.scan_owned(0x1F) == [(b"mine", 0x1F, 70, VIA_BUCKET, b"x")]
    assert local.scan_buckets(0x1F) == [(3, 80)]
