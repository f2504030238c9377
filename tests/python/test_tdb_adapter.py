"""The tdb adapter, driven the way the C bridge drives it: open_database()
and the Database methods. Real tdb files, real processes."""

from __future__ import annotations

import inspect
import os
import select
import signal
import struct
import subprocess
import threading
import time
import traceback

import pytest

from dbwrap_py.database import TDB_INSERT, TDB_MODIFY, open_database
from dbwrap_py.errors import (
    AccessDenied,
    ConfigError,
    Corruption,
    LockConflict,
    NameCollision,
    NotFound,
    NotSupported,
    Unavailable,
)

TDB_REPLACE = 1
TDB_CLEAR_IF_FIRST = 1
TDB_SEQNUM = 128
TDB_INCOMPATIBLE_HASH = 2048
RW = os.O_RDWR | os.O_CREAT
TIMEOUT = 10.0  # seconds; no wait in this file may last longer
TDBDUMP = "/usr/bin/tdbdump"


def open_tdb(path, tdb_flags: int = 0, open_flags: int = RW, hash_size: int = 0, options=()):
    return open_database(str(path), hash_size, tdb_flags, open_flags, 0o600, 0, 0, "tdb", list(options))


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
def path(tmp_path):
    return tmp_path / "test.tdb"


@pytest.fixture
def db(path):
    database = open_tdb(path)
    yield database
    database.close()


# -- processes ----------------------------------------------------------------


def fork(fn) -> int:
    """Run ``fn`` in a forked child; its return value (or 0) is the exit code."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = fn() or 0
        except BaseException:
            traceback.print_exc()
            code = 98
        finally:
            os._exit(code)
    return pid


def wait(pid: int, timeout: float = TIMEOUT) -> int:
    """The child's exit code; a child still running after ``timeout`` is killed
    and the test fails."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child {pid} did not finish within {timeout}s")
        time.sleep(0.002)


class Pipe:
    """A one-way byte channel with a timeout on every read."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def send(self, msg: bytes = b"!") -> None:
        os.write(self.w, msg)

    def recv(self, timeout: float = TIMEOUT) -> bytes:
        ready, _, _ = select.select([self.r], [], [], timeout)
        if not ready:
            raise TimeoutError("no message within the timeout")
        return os.read(self.r, 64)

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def pipes():
    made: list[Pipe] = []

    def make() -> Pipe:
        made.append(Pipe())
        return made[-1]

    yield make
    for p in made:
        p.close()


def lock_in_thread(db, key: bytes) -> threading.Event:
    """Start db.lock(key) in a thread; the event is set once it is granted."""
    granted = threading.Event()

    def run() -> None:
        db.lock(key)
        granted.set()

    threading.Thread(target=run, daemon=True).start()
    return granted


# -- records --------------------------------------------------------------------


def test_round_trip(db, path):
    assert db.fetch(b"k") is None
    assert db.lock(b"k") is None
    db.store(b"k", b"v1", TDB_REPLACE)
    assert db.fetch(b"k") == b"v1"
    db.unlock(b"k")
    assert db.lock(b"k") == b"v1"
    db.unlock(b"k")
    db.close()
    again = open_tdb(path)  # persistent: survives close and reopen
    try:
        assert again.fetch(b"k") == b"v1"
        assert again.fetch(b"other") is None
    finally:
        again.close()


def test_binary_keys_and_empty_values(db):
    keys = [b"\x00", b"a\x00b", b"\x00\x00\x00", b"\xff\xfe\x80", b"a", b"a\x00"]
    for i, key in enumerate(keys):
        put(db, key, bytes([i]) * i)
    for i, key in enumerate(keys):
        assert db.fetch(key) == bytes([i]) * i
    assert db.fetch(b"\x00") == b""  # empty value, not a missing record
    assert db.exists(b"\x00")
    assert not db.exists(b"\x00\x00")
    assert dict(db.traverse(False)) == {key: bytes([i]) * i for i, key in enumerate(keys)}


def test_large_value(db):
    value = os.urandom(1 << 20)
    put(db, b"big", value)
    assert db.fetch(b"big") == value


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
    for i in range(200):
        put(db, b"key%d" % i, b"val%d" % i)
    seen = list(db.traverse(False))
    assert len(seen) == 200
    assert dict(seen) == {b"key%d" % i: b"val%d" % i for i in range(200)}


def test_traverse_write_deletes_everything(db):
    for i in range(100):
        put(db, b"key%d" % i, b"val%d" % i)
    count = 0
    for key, value in db.traverse(True):
        assert value == b"val" + key[3:]
        db.delete(key)
        count += 1
    assert count == 100
    assert list(db.traverse(False)) == []


def test_read_only_open_refuses_writes(path):
    writer = open_tdb(path)
    put(writer, b"k", b"v")
    writer.close()
    reader = open_tdb(path, open_flags=os.O_RDONLY)
    try:
        assert reader.fetch(b"k") == b"v"
        with pytest.raises(AccessDenied):
            put(reader, b"k", b"w")
        assert reader.fetch(b"k") == b"v"
    finally:
        reader.close()


# -- transactions ---------------------------------------------------------------


def test_transaction_commit(db, path):
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
    delete(db, b"gone")
    put(db, b"added", b"3")
    assert db.fetch(b"keep") == b"changed"
    db.transaction_cancel()
    assert dict(db.traverse(False)) == {b"keep": b"1", b"gone": b"2"}


def test_nested_cancel_dooms_outer_commit(db):
    put(db, b"before", b"0")
    db.transaction_start(False)
    put(db, b"outer", b"1")
    db.transaction_start(False)
    put(db, b"inner", b"2")
    db.transaction_cancel()
    with pytest.raises(NotSupported):
        db.transaction_commit()
    assert dict(db.traverse(False)) == {b"before": b"0"}
    db.transaction_start(True)  # the tdb transaction really ended
    put(db, b"after", b"3")
    db.transaction_commit()
    assert db.fetch(b"after") == b"3"


def test_transactions_refused_on_clear_if_first(tmp_path):
    volatile = open_tdb(tmp_path / "volatile.tdb", TDB_CLEAR_IF_FIRST)
    try:
        with pytest.raises(NotSupported):
            volatile.transaction_start(False)
        with pytest.raises(NotSupported):
            volatile.transaction_start(True)
        put(volatile, b"k", b"v")
        assert volatile.fetch(b"k") == b"v"
    finally:
        volatile.close()


def test_nonblocking_transaction_start_conflicts(db, path, pipes):
    started, done = pipes(), pipes()

    def child():
        other = open_tdb(path)  # after_fork reopened the inherited one; this shares it
        other.transaction_start(False)
        put(other, b"from-child", b"1")
        started.send()
        done.recv()
        other.transaction_cancel()

    pid = fork(child)
    try:
        started.recv()
        with pytest.raises(LockConflict):
            db.transaction_start(True)
    finally:
        done.send()
    assert wait(pid) == 0
    db.transaction_start(True)  # free again once the child cancelled
    db.transaction_cancel()
    assert db.fetch(b"from-child") is None


# -- seqnum, wipe, check, db_id --------------------------------------------------


def test_seqnum_with_tdb_seqnum(tmp_path):
    db = open_tdb(tmp_path / "seq.tdb", TDB_SEQNUM)
    try:
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
        db.transaction_start(False)
        put(db, b"b", b"1")
        db.transaction_commit()
        changed()
        db.fetch(b"b")
        db.lock(b"b")
        db.unlock(b"b")
        assert db.seqnum() == seen[-1]
    finally:
        db.close()


def test_seqnum_without_tdb_seqnum_stays(db):
    before = db.seqnum()
    put(db, b"a", b"1")
    delete(db, b"a")
    assert db.seqnum() == before


def test_wipe(db):
    for i in range(20):
        put(db, b"%d" % i, b"v")
    db.wipe()
    assert list(db.traverse(False)) == []
    put(db, b"again", b"v")
    assert db.fetch(b"again") == b"v"


def test_check_passes_and_detects_corruption(path):
    db = open_tdb(path)
    for i in range(50):
        put(db, b"key%d" % i, b"value%d" % i * 10)
    db.check()
    db.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # scribble over everything after the header
        f.seek(1024)
        f.write(b"\xa5" * (size - 1024))
    damaged = open_tdb(path)  # the header is intact, so tdb opens it
    try:
        with pytest.raises(Corruption):
            damaged.check()
    finally:
        damaged.close()


def test_db_id_is_dev_and_ino(db, path):
    st = os.stat(path)
    assert db.db_id() == struct.pack("=QQ", st.st_dev, st.st_ino)


def _header(path) -> tuple[int, int]:
    """hash_size and rwlocks from a tdb header (magic[32], version, hash_size, rwlocks)."""
    with open(path, "rb") as f:
        return struct.unpack_from("<2I", f.read(48), 36)


def test_flags_reach_tdb(tmp_path):
    """hash_size and TDB_INCOMPATIBLE_HASH are what tdb_open got."""
    jenkins, plain = tmp_path / "jenkins.tdb", tmp_path / "plain.tdb"
    for path, flags in ((jenkins, TDB_INCOMPATIBLE_HASH), (plain, 0)):
        db = open_tdb(path, flags, hash_size=977)
        put(db, b"k", b"v")
        db.close()
    # tdb marks an incompatible-hash file with TDB_HASH_RWLOCK_MAGIC in rwlocks
    assert _header(jenkins) == (977, 0xBAD1A51)
    assert _header(plain) == (977, 0)
    reopened = open_tdb(jenkins, TDB_INCOMPATIBLE_HASH)
    try:
        assert reopened.fetch(b"k") == b"v"
    finally:
        reopened.close()


def test_two_opens_in_one_process_share_the_file(db, path):
    second = open_tdb(path)
    try:
        put(db, b"k", b"v")
        assert second.fetch(b"k") == b"v"
        assert second.db_id() == db.db_id()
    finally:
        second.close()
    assert db.fetch(b"k") == b"v"  # closing one open leaves the other working
    put(db, b"k2", b"v2")


def test_open_errors_are_typed(tmp_path):
    with pytest.raises(Unavailable, match="nodir"):
        open_tdb(tmp_path / "nodir" / "x.tdb")
    with pytest.raises(Unavailable, match="missing.tdb"):
        open_tdb(tmp_path / "missing.tdb", open_flags=os.O_RDWR)
    garbage = tmp_path / "garbage.tdb"
    garbage.write_bytes(b"this is not a tdb file" * 100)
    with pytest.raises(Unavailable, match="garbage.tdb"):
        open_tdb(garbage, open_flags=os.O_RDWR)
    # with O_CREAT, tdb itself turns a file without a tdb header into a new,
    # empty database; the adapter passes that through unchanged
    recreated = open_tdb(garbage)
    try:
        assert list(recreated.traverse(False)) == []
    finally:
        recreated.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_permission_denied(tmp_path):
    path = tmp_path / "locked.tdb"
    open_tdb(path).close()
    os.chmod(path, 0)
    with pytest.raises(AccessDenied):
        open_tdb(path)


def test_unknown_option_is_refused(path):
    with pytest.raises(ConfigError, match="hash_size"):
        open_tdb(path, options=["hash_size=5"])
    db = open_tdb(path)  # the refused open released the file again
    db.close()


RECORD_METHODS = ("get", "put", "lock", "unlock", "try_lock", "lock_get", "put_unlock", "exists", "remove")


def test_the_class_you_read_is_what_runs(db):
    """The record methods are the C base class's, found on the class: none is
    installed on the instance, and TdbAdapter defines none of its own."""
    from dbwrap_py.adapters.tdb._tdb import TdbRecords
    from dbwrap_py.adapters.tdb.adapter import TdbAdapter

    adapter = db.adapter
    assert type(adapter) is TdbAdapter
    assert TdbAdapter.__mro__[1] is TdbRecords
    for name in RECORD_METHODS:
        assert name not in TdbAdapter.__dict__, name
        assert inspect.getattr_static(TdbAdapter, name) is TdbRecords.__dict__[name], name
        assert getattr(adapter, name).__self__ is adapter, name
    assert not set(vars(adapter)) & set(RECORD_METHODS)


def test_no_ctypes_and_no_python3_tdb():
    """The adapter's one way into tdb is its own extension."""
    from dbwrap_py.adapters.tdb import adapter as tdb_adapter

    source = inspect.getsource(tdb_adapter)
    assert "ctypes" not in source
    assert "import tdb" not in source


def test_closing_one_open_leaves_the_shared_file_to_the_other(path):
    first, second = open_tdb(path), open_tdb(path)
    assert first.adapter.tdb_file is second.adapter.tdb_file
    put(first, b"k", b"v")
    first.close()
    assert first.adapter.tdb_file is None
    with pytest.raises(Unavailable):
        first.adapter.get(b"k")
    with pytest.raises(Unavailable):
        first.adapter.scan()
    assert second.fetch(b"k") == b"v"
    assert not second.adapter.tdb_file.closed
    second.close()


def test_a_later_read_write_open_of_a_read_only_file_is_refused(path):
    open_tdb(path).close()
    reader = open_tdb(path, open_flags=os.O_RDONLY)
    try:
        with pytest.raises(AccessDenied, match="read-only"):
            open_tdb(path)
    finally:
        reader.close()
    writer = open_tdb(path)  # the refused open released nothing it did not take
    writer.close()


def test_a_later_tdb_seqnum_switches_seqnum_on(path):
    plain = open_tdb(path)
    counted = open_tdb(path, TDB_SEQNUM)
    try:
        before = counted.seqnum()
        put(plain, b"k", b"v")
        assert counted.seqnum() != before
    finally:
        counted.close()
        plain.close()


def test_bad_arguments_raise_type_errors(db):
    adapter = db.adapter
    with pytest.raises(TypeError):
        adapter.get("not bytes")
    with pytest.raises(TypeError):
        adapter.put(b"k", "not bytes")
    with pytest.raises(TypeError):
        adapter.put(b"k")


def test_closed_database_raises_instead_of_crashing(path):
    db = open_tdb(path)
    adapter = db.adapter
    db.close()
    with pytest.raises(Unavailable):
        adapter.lock(b"k")
    with pytest.raises(Unavailable):
        adapter.get(b"k")


def test_tdbdump_reads_the_file(db, path):
    put(db, b"hello-key", b"world-value")
    put(db, b"bin\x00key", b"\x01\x02")
    out = subprocess.run([TDBDUMP, str(path)], capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert 'key(9) = "hello-key"' in out.stdout
    assert 'data(11) = "world-value"' in out.stdout
    assert 'key(7) = "bin\\00key"' in out.stdout


# -- several processes ------------------------------------------------------------


def test_lock_blocks_other_process_until_unlock(db, path, pipes):
    locked, release = pipes(), pipes()

    def child():
        other = open_tdb(path)
        other.lock(b"rec")
        other.store(b"rec", b"child", TDB_REPLACE)
        locked.send()
        release.recv()
        other.unlock(b"rec")
        other.close()

    pid = fork(child)
    try:
        locked.recv()
        granted = lock_in_thread(db, b"rec")
        assert not granted.wait(0.3), "got the lock while the child held it"
    finally:
        release.send()
    assert granted.wait(TIMEOUT), "lock not granted after the child unlocked"
    assert db.fetch(b"rec") == b"child"
    db.store(b"rec", b"parent", TDB_REPLACE)
    db.unlock(b"rec")
    assert wait(pid) == 0


def test_different_records_do_not_block(tmp_path, pipes):
    path = tmp_path / "big.tdb"
    db = open_tdb(path, hash_size=10007)
    locked, release = pipes(), pipes()

    def child():
        other = open_tdb(path)
        other.lock(b"one")
        locked.send()
        release.recv()
        other.unlock(b"one")

    pid = fork(child)
    try:
        locked.recv()
        granted = lock_in_thread(db, b"two")
        assert granted.wait(TIMEOUT), "a lock on another record had to wait"
        db.unlock(b"two")
    finally:
        release.send()
    assert wait(pid) == 0
    db.close()


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_dead_holder_releases_lock_at_once(db, path, pipes, how):
    locked, go = pipes(), pipes()

    def child():
        other = open_tdb(path)
        other.lock(b"rec")
        locked.send()
        if how == "exit":
            go.recv()
            os._exit(0)  # without unlock
        time.sleep(TIMEOUT * 2)

    pid = fork(child)
    locked.recv()
    granted = lock_in_thread(db, b"rec")
    assert not granted.wait(0.2), "got the lock while the child held it"
    start = time.monotonic()
    if how == "sigkill":
        os.kill(pid, signal.SIGKILL)
    else:
        go.send()
    wait(pid)
    assert granted.wait(TIMEOUT), "the dead child's lock was not released"
    assert time.monotonic() - start < 2.0
    db.unlock(b"rec")


def test_traverse_stopped_early_leaves_no_lock(db, path):
    """A read traverse the caller stops after one record must not leave a
    fcntl lock behind that blocks another process's transaction commit."""
    for i in range(20):
        put(db, b"key%d" % i, b"v")
    walk = db.traverse(False)
    assert next(walk)[1] == b"v"  # stop here, keep the walk alive

    def child():
        other = open_tdb(path)
        other.transaction_start(False)
        put(other, b"committed", b"1")
        other.transaction_commit()

    assert wait(fork(child), 5) == 0
    assert db.fetch(b"committed") == b"1"
    assert len(list(walk)) == 19  # the walk itself still completes
    del walk


def test_no_lost_updates(db, path):
    procs, rounds = 4, 200
    put(db, b"counter", b"0")

    def child():
        other = open_tdb(path)
        for _ in range(rounds):
            value = other.lock(b"counter")
            other.store(b"counter", b"%d" % (int(value) + 1), TDB_REPLACE)
            other.unlock(b"counter")
        other.close()

    pids = [fork(child) for _ in range(procs)]
    assert [wait(pid, 30) for pid in pids] == [0] * procs
    assert db.fetch(b"counter") == b"%d" % (procs * rounds)


def test_clear_if_first(path):
    old = open_tdb(path)
    put(old, b"stale", b"data")
    old.close()

    first = open_tdb(path, TDB_CLEAR_IF_FIRST)  # the first opener wipes
    assert first.fetch(b"stale") is None
    assert list(first.traverse(False)) == []
    put(first, b"fresh", b"1")

    def child():
        first.close()  # drop the inherited handle, so the next open is a real tdb_open
        second = open_tdb(path, TDB_CLEAR_IF_FIRST)
        return 0 if second.fetch(b"fresh") == b"1" else 1

    assert wait(fork(child)) == 0, "a second opener wiped the database"
    assert first.fetch(b"fresh") == b"1"
    first.close()

    again = open_tdb(path, TDB_CLEAR_IF_FIRST)  # first opener again
    try:
        assert again.fetch(b"fresh") is None
    finally:
        again.close()


def test_database_opened_before_fork(db, path):
    put(db, b"parent", b"1")

    def child():
        if db.fetch(b"parent") != b"1":
            return 1
        put(db, b"child", b"2")
        if db.lock(b"parent") != b"1":
            return 2
        db.store(b"parent", b"changed by child", TDB_REPLACE)
        db.unlock(b"parent")
        return 0

    assert wait(fork(child)) == 0
    assert db.fetch(b"child") == b"2"
    assert db.fetch(b"parent") == b"changed by child"
    put(db, b"parent", b"3")
    assert db.fetch(b"parent") == b"3"


def test_fork_while_parent_holds_a_lock(tmp_path, pipes):
    """tdb refuses to reopen a context with locks held; the child opens afresh,
    has no lock of its own, and still waits for the parent's."""
    path = tmp_path / "held.tdb"
    db = open_tdb(path, hash_size=10007)
    put(db, b"other", b"x")
    db.lock(b"held")
    result = pipes()

    def child():
        ok = db.fetch(b"other") == b"x"
        granted = lock_in_thread(db, b"held")
        blocked = not granted.wait(0.3)
        result.send(b"1" if ok and blocked else b"0")
        if not granted.wait(TIMEOUT):
            return 3
        db.unlock(b"held")
        return 0

    pid = fork(child)
    try:
        assert result.recv() == b"1"
    finally:
        db.unlock(b"held")
    assert wait(pid) == 0
    db.close()


def test_every_open_of_the_file_follows_a_fresh_reopen(tmp_path):
    """Two opens share one TdbFile; when the child must open it afresh (the
    parent held a lock at fork), both opens use the new context."""
    path = tmp_path / "shared.tdb"
    first = open_tdb(path, hash_size=10007)
    second = open_tdb(path)
    put(first, b"k", b"v")
    first.lock(b"held")

    def child():
        if second.fetch(b"k") != b"v" or first.fetch(b"k") != b"v":
            return 1
        put(second, b"from-child", b"1")
        first.close()
        return 0 if second.fetch(b"from-child") == b"1" else 2

    try:
        assert wait(fork(child)) == 0
    finally:
        first.unlock(b"held")
    assert second.fetch(b"from-child") == b"1"
    second.close()
    first.close()


def test_clear_if_first_survives_fork(tmp_path):
    """The child reopens with its own active lock: when the parent closes, the
    next opener is not 'first' while the child still has it open."""
    path = tmp_path / "volatile.tdb"
    db = open_tdb(path, TDB_CLEAR_IF_FIRST)
    put(db, b"k", b"v")
    go, ready = Pipe(), Pipe()
    try:

        def child():
            ready.send()
            go.recv()
            return 0 if db.fetch(b"k") == b"v" else 1

        pid = fork(child)
        ready.recv()
        db.close()
        reopened = open_tdb(path, TDB_CLEAR_IF_FIRST)  # the child is still an opener
        assert reopened.fetch(b"k") == b"v"
        reopened.close()
        go.send()
        assert wait(pid) == 0
    finally:
        go.close()
        ready.close()


def test_native_records_offered_and_switchable(path):
    """The bridge's hot path runs the C operations when the adapter offers
    them; native_records=no withdraws them (to measure the Python path)."""
    native = open_tdb(path)
    python_path = open_tdb(path, options=["native_records=no"])
    try:
        capsule = native.adapter.native_records
        assert type(capsule).__name__ == "PyCapsule"
        assert "dbwrap_py.native_records.v2" in repr(capsule)
        assert python_path.adapter.native_records is None
    finally:
        python_path.close()
        native.close()


def test_native_records_option_is_checked(path):
    with pytest.raises(ConfigError):
        open_tdb(path, options=["native_records=maybe"])
