"""The memory adapter, driven the way the C bridge drives it: open_database()
and the Database methods."""

from __future__ import annotations

import os

import pytest

from dbwrap_py.database import TDB_INSERT, TDB_MODIFY, open_database
from dbwrap_py.errors import ConfigError, NameCollision, NotFound, NotSupported

TDB_REPLACE = 1
TDB_CLEAR_IF_FIRST = 1
RW = os.O_RDWR | os.O_CREAT


def open_mem(name: str = "test.db", tdb_flags: int = 0, options=()):
    return open_database(name, 0, tdb_flags, RW, 0o600, 0, 0, "memory", list(options))


def put(db, key: bytes, value: bytes, flag: int = TDB_REPLACE) -> None:
    """fetch_locked + storev + unlock, as dbwrap does it."""
    db.lock(key)
    try:
        db.store(key, value, flag)
    finally:
        db.unlock(key)


def delete(db, key: bytes) -> None:
    db.lock(key)
    try:
        db.delete(key)
    finally:
        db.unlock(key)


@pytest.fixture
def db():
    database = open_mem()
    yield database
    database.close()


def test_round_trip(db):
    assert db.fetch(b"k") is None
    assert db.lock(b"k") is None
    db.store(b"k", b"v1", TDB_REPLACE)
    assert db.fetch(b"k") == b"v1"  # read-your-writes while locked
    db.unlock(b"k")
    assert db.fetch(b"k") == b"v1"
    assert db.lock(b"k") == b"v1"  # lock returns the current value
    db.unlock(b"k")
    put(db, b"k", b"v2")
    assert db.fetch(b"k") == b"v2"
    assert db.fetch(b"other") is None


def test_binary_keys_and_empty_values(db):
    keys = [b"\x00", b"a\x00b", b"\x00\x00\x00", b"\xff\xfe\x80", b"a", b"a\x00"]
    for i, key in enumerate(keys):
        put(db, key, bytes([i]) * i)
    for i, key in enumerate(keys):
        assert db.fetch(key) == bytes([i]) * i
    # b"\x00" holds an empty value: it exists and is b"", not None
    assert db.fetch(b"\x00") == b""
    assert db.exists(b"\x00")
    assert not db.exists(b"\x00\x00")
    assert dict(db.traverse(False)) == {key: bytes([i]) * i for i, key in enumerate(keys)}


def test_store_flags(db):
    with pytest.raises(NotFound):
        put(db, b"k", b"x", TDB_MODIFY)
    assert db.fetch(b"k") is None
    put(db, b"k", b"1", TDB_INSERT)
    with pytest.raises(NameCollision):
        put(db, b"k", b"2", TDB_INSERT)
    assert db.fetch(b"k") == b"1"
    put(db, b"k", b"3", TDB_MODIFY)
    assert db.fetch(b"k") == b"3"
    put(db, b"k", b"4", TDB_REPLACE)
    assert db.fetch(b"k") == b"4"


def test_delete(db):
    put(db, b"k", b"v")
    delete(db, b"k")
    assert db.fetch(b"k") is None
    assert not db.exists(b"k")
    with pytest.raises(NotFound):
        delete(db, b"k")
    with pytest.raises(NotFound):
        delete(db, b"never")


def test_traverse_read_counts(db):
    for i in range(50):
        put(db, b"key%d" % i, b"val%d" % i)
    seen = list(db.traverse(False))
    assert len(seen) == 50
    assert dict(seen) == {b"key%d" % i: b"val%d" % i for i in range(50)}


def test_traverse_write_deletes_everything(db):
    for i in range(30):
        put(db, b"key%d" % i, b"val%d" % i)
    count = 0
    for key, value in db.traverse(True):
        assert value == b"val" + key[3:]
        db.delete(key)  # the record is locked for us during the walk
        count += 1
    assert count == 30
    assert list(db.traverse(False)) == []
    assert db.fetch(b"key0") is None


def test_traverse_write_may_store(db):
    for i in range(10):
        put(db, b"%d" % i, b"x")
    for key, _ in db.traverse(True):
        db.store(key, b"y" + key, TDB_REPLACE)
    assert dict(db.traverse(False)) == {b"%d" % i: b"y%d" % i for i in range(10)}


def test_transaction_commit(db):
    put(db, b"old", b"1")
    db.transaction_start(False)
    put(db, b"new", b"2")
    delete(db, b"old")
    db.transaction_commit()
    assert db.fetch(b"new") == b"2"
    assert db.fetch(b"old") is None


def test_transaction_cancel_rolls_back(db):
    put(db, b"keep", b"1")
    put(db, b"gone", b"2")
    db.transaction_start(False)
    put(db, b"keep", b"changed")
    put(db, b"keep", b"changed twice")
    delete(db, b"gone")
    put(db, b"added", b"3")
    assert db.fetch(b"keep") == b"changed twice"  # visible inside the transaction
    db.transaction_cancel()
    assert dict(db.traverse(False)) == {b"keep": b"1", b"gone": b"2"}


def test_wipe_inside_transaction_is_undone(db):
    put(db, b"a", b"1")
    db.transaction_start(False)
    db.wipe()
    assert db.fetch(b"a") is None
    db.transaction_cancel()
    assert db.fetch(b"a") == b"1"


def test_nested_cancel_dooms_outer_commit(db):
    put(db, b"before", b"0")
    db.transaction_start(False)
    put(db, b"outer", b"1")
    db.transaction_start(False)
    put(db, b"inner", b"2")
    db.transaction_cancel()  # inner
    with pytest.raises(NotSupported):
        db.transaction_commit()  # outer
    assert dict(db.traverse(False)) == {b"before": b"0"}
    # and the database takes a new transaction afterwards
    db.transaction_start(False)
    put(db, b"after", b"3")
    db.transaction_commit()
    assert db.fetch(b"after") == b"3"


def test_nested_commit_then_outer_commit(db):
    db.transaction_start(False)
    db.transaction_start(False)
    put(db, b"k", b"v")
    db.transaction_commit()
    db.transaction_commit()
    assert db.fetch(b"k") == b"v"


def test_transactions_refused_on_clear_if_first():
    volatile = open_mem("volatile.db", TDB_CLEAR_IF_FIRST)
    try:
        with pytest.raises(NotSupported):
            volatile.transaction_start(False)
        put(volatile, b"k", b"v")  # still a working database
        assert volatile.fetch(b"k") == b"v"
    finally:
        volatile.close()


def test_seqnum_changes_on_every_write(db):
    seen = [db.seqnum()]

    def changed():
        now = db.seqnum()
        assert now != seen[-1]
        seen.append(now)

    put(db, b"a", b"1")
    changed()
    put(db, b"a", b"2")
    changed()
    delete(db, b"a")
    changed()
    db.wipe()
    changed()
    db.transaction_start(False)
    put(db, b"b", b"1")
    changed()
    db.transaction_commit()
    changed()
    # reads do not change it
    db.fetch(b"b")
    db.lock(b"b")
    db.unlock(b"b")
    list(db.traverse(False))
    assert db.seqnum() == seen[-1]


def test_wipe_and_check(db):
    for i in range(5):
        put(db, b"%d" % i, b"v")
    db.check()
    db.wipe()
    assert list(db.traverse(False)) == []
    db.check()


def test_reentrant_lock(db):
    db.lock(b"k")
    db.lock(b"k")
    db.store(b"k", b"v", TDB_REPLACE)
    db.unlock(b"k")
    db.unlock(b"k")
    assert db.fetch(b"k") == b"v"


def test_each_open_is_a_fresh_database():
    first = open_mem("same.db")
    second = open_mem("same.db")
    try:
        put(first, b"k", b"v")
        assert second.fetch(b"k") is None
        assert first.db_id() != second.db_id()
        assert isinstance(first.db_id(), bytes) and first.db_id()
    finally:
        first.close()
        second.close()
    third = open_mem("same.db")
    assert third.fetch(b"k") is None
    third.close()


def test_capabilities():
    from dbwrap_py.adapters.memory import MemoryAdapter

    assert MemoryAdapter.capabilities.transactions is True
    assert MemoryAdapter.capabilities.multi_process is False


def test_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="nosuchoption"):
        open_mem(options=["nosuchoption=1"])
