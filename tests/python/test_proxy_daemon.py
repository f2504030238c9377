"""The proxy daemon, driven over its socket the way smbd's processes drive it:
a real daemon process (ProxyDaemonProcess), real connections, real kills.

Every wait here is bounded by a socket timeout or a future's timeout.
"""

from __future__ import annotations

import grp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.client import ConnectionClosed, ProxyClient, ProxyError
from dbwrap_py.proxy.daemon import ProxyDaemonProcess
from dbwrap_py.proxy.fuzz import fuzz
from dbwrap_py.proxy.wire import Op, Txn

TIMEOUT = 10.0        # no wait in this file lasts longer
PARKED = 0.3          # long enough to see that a request waits
TDB_SEQNUM = 128
TDB_INSERT = 2


@pytest.fixture(scope="module")
def daemon():
    with ProxyDaemonProcess() as running:
        yield running
        assert "internal error" not in running.log_text()  # no bug of ours was hit on the way


@pytest.fixture
def name():
    """A memory database no other test shares."""
    return f"db-{uuid.uuid4().hex}"


@pytest.fixture(params=["memory", "tdb"])
def target(request, name, tmp_path):
    """(name, adapter) of a fresh database: the daemon's table, then the
    adapter's own lock (a tdb chainlock) under it."""
    if request.param == "tdb":
        return str(tmp_path / f"{name}.tdb"), "tdb"
    return name, "memory"


@pytest.fixture
def background():
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield pool


def connect(daemon: ProxyDaemonProcess, timeout: float = TIMEOUT) -> ProxyClient:
    client = ProxyClient(daemon.socket_path, timeout)
    client.hello()
    return client


def status_of(fn, *args) -> int:
    with pytest.raises(ProxyError) as caught:
        fn(*args)
    return caught.value.status


def still_waiting(future: Future) -> bool:
    time.sleep(PARKED)
    return not future.done()


def closed_by_daemon(client: ProxyClient) -> bool:
    """True when the daemon has closed this connection (EOF within TIMEOUT)."""
    client.sock.settimeout(TIMEOUT)
    try:
        return client.sock.recv(1) == b""
    except ConnectionResetError:
        return True


# -- HELLO --------------------------------------------------------------------


def test_hello_agrees_on_the_version(daemon):
    with ProxyClient(daemon.socket_path, TIMEOUT) as client:
        assert client.hello(1, 7) == (wire.VERSION, wire.MAX_MESSAGE)


def test_hello_without_a_common_version_is_refused_and_closed(daemon):
    with ProxyClient(daemon.socket_path, TIMEOUT) as client:
        assert status_of(client.hello, wire.VERSION + 1, wire.VERSION + 3) == nt.NT_STATUS_NOT_SUPPORTED
        assert closed_by_daemon(client)


@pytest.mark.parametrize("first", ["open_before_hello", "bad_magic"])
def test_no_hello_first_closes_the_connection(daemon, first):
    with ProxyClient(daemon.socket_path, TIMEOUT) as client:
        with pytest.raises(ConnectionClosed):
            if first == "bad_magic":
                client.hello(magic=0x12345678)
            else:
                client.open("x", "memory")


# -- records ------------------------------------------------------------------


def test_record_operations_on_tdb(daemon, tmp_path):
    with connect(daemon) as client:
        db = client.open(str(tmp_path / "a.tdb"), "tdb", tdb_flags=TDB_SEQNUM)
        assert client.fetch(db, b"k") is None
        before = client.seqnum(db)
        assert client.lock(db, b"k") is None
        client.store(db, b"k", b"v1")
        client.unlock(db, b"k")
        assert client.fetch(db, b"k") == b"v1"
        assert client.exists(db, b"k") and not client.exists(db, b"other")
        assert client.seqnum(db) != before
        client.lock(db, b"k")
        assert status_of(client.store, db, b"k", b"v2", TDB_INSERT) == nt.NT_STATUS_OBJECT_NAME_COLLISION
        client.delete(db, b"k")
        assert status_of(client.delete, db, b"k") == nt.NT_STATUS_NOT_FOUND
        client.unlock(db, b"k", b"put-unlock")  # UNLOCK with a value stores it
        assert client.fetch(db, b"k") == b"put-unlock"
        assert client.db_id(db)
        client.check(db)
        client.wipe(db)
        assert client.fetch(db, b"k") is None
        client.close_db(db)


def test_connections_share_one_database(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        one.lock(a, b"k")
        one.unlock(a, b"k", b"seen by both")
        assert two.fetch(b, b"k") == b"seen by both"


def test_database_closes_with_its_last_handle(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        fill(one, a, {b"k": b"v"})
        one.close_db(a)
        assert two.fetch(b, b"k") == b"v"  # two's reference keeps it open
        two.close_db(b)
        again = one.open(name, "memory")
        assert again != a and one.fetch(again, b"k") is None  # memory: a fresh dict each open


def test_open_error_is_a_reply_not_a_hang_up(daemon, name):
    with connect(daemon) as client:
        with pytest.raises(ProxyError) as caught:
            client.open(name, "no-such-adapter")
        assert caught.value.status == nt.NT_STATUS_INVALID_PARAMETER
        assert client.fetch(client.open(name, "memory"), b"k") is None


def test_second_connection_waits_for_the_lock(daemon, target, background):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(*target), two.open(*target)
        one.lock(a, b"k")
        waiter = background.submit(two.lock, b, b"k")
        assert still_waiting(waiter)
        one.unlock(a, b"k", b"from one")
        assert waiter.result(TIMEOUT) == b"from one"
        assert status_of(one.lock, a, b"k", 50) == nt.NT_STATUS_IO_TIMEOUT  # two has it now


def test_lock_wait_ends_with_io_timeout(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        one.lock(a, b"k")
        started = time.monotonic()
        assert status_of(two.lock, b, b"k", 150) == nt.NT_STATUS_IO_TIMEOUT
        assert 0.14 <= time.monotonic() - started < 2
        assert status_of(two.store, b, b"k", b"x") == nt.NT_STATUS_FILE_LOCK_CONFLICT  # nothing held
        assert status_of(two.lock, b, b"k", 0) == nt.NT_STATUS_IO_TIMEOUT  # 0: no wait at all
        one.unlock(a, b"k")
        assert two.lock(b, b"k", 0) is None


def test_nested_lock_needs_as_many_unlocks(daemon, target):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(*target), two.open(*target)
        one.lock(a, b"k")
        one.store(a, b"k", b"inner")
        assert one.lock(a, b"k", 0) == b"inner"  # nests, sees its own write
        one.unlock(a, b"k")
        assert status_of(two.lock, b, b"k", 50) == nt.NT_STATUS_IO_TIMEOUT
        one.store(a, b"k", b"still held")
        one.unlock(a, b"k")
        assert two.lock(b, b"k", 0) == b"still held"


def test_store_and_delete_need_the_record_locked(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        assert status_of(one.store, a, b"k", b"v") == nt.NT_STATUS_FILE_LOCK_CONFLICT
        two.lock(b, b"k")
        two.store(b, b"k", b"v")
        assert status_of(one.store, a, b"k", b"w") == nt.NT_STATUS_FILE_LOCK_CONFLICT
        assert status_of(one.delete, a, b"k") == nt.NT_STATUS_FILE_LOCK_CONFLICT
        two.unlock(b, b"k")
        assert one.fetch(a, b"k") == b"v"


def test_close_releases_the_connections_locks(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        one.lock(a, b"k")
        one.close_db(a)
        assert two.lock(b, b"k", 1000) is None
        with pytest.raises(ConnectionClosed):  # the handle is gone: malformed
            one.fetch(a, b"k")


# -- traverses ----------------------------------------------------------------


def fill(client: ProxyClient, db: int, records: dict[bytes, bytes]) -> None:
    for key, value in records.items():
        client.lock(db, key)
        client.unlock(db, key, value)


RECORDS = {b"k%d" % i: b"v%d" % i for i in range(5)}


def test_read_traverse_sees_every_record(daemon, name):
    with connect(daemon) as client:
        db = client.open(name, "memory")
        fill(client, db, RECORDS)
        assert dict(client.traverse(db)) == RECORDS


def test_write_traverse_locks_the_current_record_and_may_delete_it(daemon, target):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(*target), two.open(*target)
        fill(one, a, RECORDS)
        seen = {}
        for key, value in one.traverse(a, write=True):
            seen[key] = value
            assert status_of(two.lock, b, key, 20) == nt.NT_STATUS_IO_TIMEOUT
            if key == b"k2":
                one.delete(a, key)
            else:
                one.store(a, key, value + b"+")
        assert seen == RECORDS
        assert dict(two.traverse(b)) == {k: v + b"+" for k, v in RECORDS.items() if k != b"k2"}
        assert two.lock(b, b"k4", 0) == b"v4+"  # the traverse let go of its last record


def test_traverse_end_lets_go_of_the_current_record(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        fill(one, a, RECORDS)
        number = one.traverse_start(a, write=True)
        key, _ = one.traverse_next(a, number)
        assert status_of(two.lock, b, key, 20) == nt.NT_STATUS_IO_TIMEOUT
        one.traverse_end(a, number)
        assert two.lock(b, key, 0) == RECORDS[key]
        with pytest.raises(ConnectionClosed):  # its number is gone
            one.traverse_next(a, number)


def test_write_traverse_skips_records_deleted_meanwhile(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        fill(one, a, RECORDS)
        number = one.traverse_start(a, write=True)
        first, _ = one.traverse_next(a, number)
        for key in RECORDS:
            if key != first:
                two.lock(b, key)
                two.delete(b, key)
                two.unlock(b, key)
                break
        rest = []
        while (record := one.traverse_next(a, number)) is not None:
            rest.append(record[0])
        assert key not in rest and len(rest) == len(RECORDS) - 2


def test_write_traverse_waits_for_a_record_another_connection_holds(daemon, name, background):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        fill(one, a, {b"only": b"old"})
        two.lock(b, b"only")
        number = one.traverse_start(a, write=True)
        step = background.submit(one.traverse_next, a, number)
        assert still_waiting(step)
        two.unlock(b, b"only", b"new")
        assert step.result(TIMEOUT) == (b"only", b"new")
        assert one.traverse_next(a, number) is None


# -- transactions -------------------------------------------------------------


def test_transaction_parks_other_connections_until_commit(daemon, target, background):
    with connect(daemon) as one, connect(daemon) as two, connect(daemon) as three:
        a, b, c = one.open(*target), two.open(*target), three.open(*target)
        one.transaction(a, Txn.START)
        one.transaction(a, Txn.START)  # nested: counted
        one.lock(a, b"k")
        one.unlock(a, b"k", b"in the transaction")
        reader = background.submit(two.fetch, b, b"k")
        assert still_waiting(reader)
        assert status_of(three.transaction, c, Txn.START_NONBLOCK) == nt.NT_STATUS_FILE_LOCK_CONFLICT
        one.transaction(a, Txn.COMMIT)
        assert still_waiting(reader)  # the inner commit only counted
        one.transaction(a, Txn.COMMIT)
        assert reader.result(TIMEOUT) == b"in the transaction"
        three.transaction(c, Txn.START_NONBLOCK)
        three.transaction(c, Txn.CANCEL)


def test_releasing_a_lock_passes_the_gate_but_writing_does_not(daemon, name, background):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        two.lock(b, b"plain")
        two.lock(b, b"with value")
        one.transaction(a, Txn.START)
        two.unlock(b, b"plain")  # must not wait: the transaction may want that record
        assert one.lock(a, b"plain", 1000) is None
        writer = background.submit(two.unlock, b, b"with value", b"after")
        assert still_waiting(writer)
        one.transaction(a, Txn.CANCEL)
        writer.result(TIMEOUT)
        assert two.fetch(b, b"with value") == b"after"


def test_adapter_error_is_replied_and_logged(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory", tdb_flags=1), two.open(name, "memory", tdb_flags=1)
        with pytest.raises(ProxyError) as caught:
            one.transaction(a, Txn.START)  # CLEAR_IF_FIRST: not persistent, no transactions
        assert caught.value.status == nt.NT_STATUS_NOT_SUPPORTED
        assert caught.value.cause.startswith("NotSupported: ")
        with pytest.raises(ProxyError) as again:  # the failed start left no gate closed
            two.transaction(b, Txn.START_NONBLOCK)
        assert again.value.status == nt.NT_STATUS_NOT_SUPPORTED
        assert f"{name}: TRANSACTION start: NotSupported" in daemon.log_text()


def test_commit_without_a_transaction_does_not_touch_anothers(daemon, name):
    with connect(daemon) as one, connect(daemon) as two:
        a, b = one.open(name, "memory"), two.open(name, "memory")
        one.transaction(a, Txn.START)
        assert status_of(two.transaction, b, Txn.COMMIT) == nt.NT_STATUS_NOT_SUPPORTED
        one.transaction(a, Txn.CANCEL)


def test_disconnect_cancels_the_transaction(daemon, name, background):
    with connect(daemon) as two:
        b = two.open(name, "memory")
        fill(two, b, {b"k": b"before"})
        one = connect(daemon)
        a = one.open(name, "memory")
        one.transaction(a, Txn.START)
        one.lock(a, b"k")
        one.unlock(a, b"k", b"never committed")
        reader = background.submit(two.fetch, b, b"k")
        assert still_waiting(reader)
        one.close()
        assert reader.result(TIMEOUT) == b"before"


# -- crashes and bad input ----------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from dbwrap_py.proxy.client import ProxyClient
    client = ProxyClient(sys.argv[1], 10)
    client.hello()
    db = client.open(sys.argv[2], sys.argv[3])
    client.lock(db, b"k")
    print("locked", flush=True)
    time.sleep(60)
""")


def test_killed_holder_lets_go_at_once(daemon, target, background):
    with connect(daemon) as waiter_client:
        db = waiter_client.open(*target)  # keeps the database open past the holder
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, daemon.socket_path, *target],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            waiter = background.submit(lambda: (waiter_client.lock(db, b"k"), time.monotonic())[1])
            assert still_waiting(waiter)
            killed = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)
            granted = waiter.result(TIMEOUT)
        finally:
            holder.kill()
            holder.wait(TIMEOUT)
        ms = (granted - killed) * 1000
        print(f"lock handed over {ms:.1f} ms after the holder's SIGKILL")
        assert ms < 1000


def test_malformed_input_closes_only_that_connection(daemon, name):
    with connect(daemon) as good:
        db = good.open(name, "memory")
        good.lock(db, b"held")
        with connect(daemon) as bad:
            bad_db = bad.open(name, "memory")
            bad.lock(bad_db, b"bad's")
            bad.send_raw(wire.LENGTH.pack(3) + b"\xff\x00\x00")
            assert closed_by_daemon(bad)
        assert good.lock(db, b"bad's", 1000) is None  # freed with the bad connection
        with connect(daemon) as other:  # good still holds its record
            assert status_of(other.lock, other.open(name, "memory"), b"held", 50) == nt.NT_STATUS_IO_TIMEOUT
        good.unlock(db, b"held", b"fine")
        assert good.fetch(db, b"held") == b"fine"


@pytest.mark.parametrize("garbage", [
    wire.LENGTH.pack(wire.MAX_MESSAGE + 1),                    # too long a body
    wire.request(Op.FETCH, 7777).bytes(b"k").message(),        # unknown handle
    wire.request(Op.FETCH, 1).message(),                       # a field missing
    wire.request(Op.SEQNUM, 1).u8(0).message(),                # a byte too many
    wire.request(Op.HELLO).u32(wire.MAGIC).u16(1).u16(1).u32(0).message(),  # HELLO again
])
def test_each_kind_of_malformed_request_closes_the_connection(daemon, name, garbage):
    with connect(daemon) as bad:
        assert bad.open(name, "memory") == 1
        bad.send_raw(garbage)
        assert closed_by_daemon(bad)
    with connect(daemon) as good:
        assert good.open(name, "memory")


def test_group_makes_the_socket_0660_of_that_group(tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    config = tmp_path / "daemon.conf"  # --group needs one (test_security_daemon.py)
    config.write_text(f"[daemon]\ndirectories = {tmp_path}\n\n[database *]\nadapter = memory\n")
    config.chmod(0o600)
    with ProxyDaemonProcess(group=group, config=config) as own:
        found = os.stat(own.socket_path)
        assert (found.st_mode & 0o777, found.st_gid) == (0o660, os.getgid())
        with connect(own) as client:
            client.open(str(tmp_path / "x"), "memory")


def test_daemon_killed_then_restarted():
    with ProxyDaemonProcess() as own:
        client = connect(own)
        db = client.open("x", "memory")
        own.kill()
        with pytest.raises((ConnectionClosed, OSError)):
            client.fetch(db, b"k")
        client.close()
        own.start()
        with connect(own) as again:
            db = again.open("x", "memory")
            again.lock(db, b"k")
            again.unlock(db, b"k", b"back")
            assert again.fetch(db, b"k") == b"back"


def test_sigterm_removes_the_socket_and_exits_0():
    with ProxyDaemonProcess() as own:
        process = own.process
        assert oct(os.stat(own.socket_path).st_mode & 0o777) == oct(0o600)
        with connect(own) as client:
            client.open("x", "memory")
            own.stop(signal.SIGTERM)
            assert closed_by_daemon(client)
        assert process.returncode == 0
        assert not os.path.exists(own.socket_path)
        assert "proxy daemon pid" in own.log_text()


def _plant(place: Path, kind: str) -> Path:
    """Something other than a socket at place/s.sock; returns the path."""
    path = place / "s.sock"
    target = place / "precious"
    target.write_text("keep me")
    if kind == "regular file":
        path.write_text("keep me too")
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("keep me too")
    elif kind == "symlink to a file":
        path.symlink_to(target)
    elif kind == "symlink to a dead socket":  # a stale socket, but reached through a link
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(target.with_name("dead.sock")))
        dead.close()
        path.symlink_to(target.with_name("dead.sock"))
    elif kind == "dangling symlink":
        path.symlink_to(place / "nowhere")
    return path


def _snapshot(place: Path) -> dict[str, tuple]:
    """Every entry under place: its type, inode, link target and contents."""
    found = {}
    for entry in sorted(place.rglob("*")):
        st = entry.lstat()
        found[str(entry)] = (st.st_mode, st.st_ino,
                             os.readlink(entry) if entry.is_symlink() else None,
                             entry.read_bytes() if entry.is_file() and not entry.is_symlink() else None)
    return found


@pytest.mark.parametrize("kind", ["regular file", "directory", "symlink to a file",
                                  "symlink to a dead socket", "dangling symlink"])
def test_a_socket_path_that_is_not_a_socket_is_refused_and_left_in_place(tmp_path, kind):
    """The attack: something planted (or mistyped) at --socket. The daemon,
    as root, must not unlink it: it refuses to start, says what is there,
    and every file is as it was."""
    path = _plant(tmp_path, kind)
    before = _snapshot(tmp_path)
    result = subprocess.run([sys.executable, "-m", "dbwrap_py.proxy.daemon", "--socket", str(path)],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1, result
    kind_said = "a symlink" if "symlink" in kind else f"a {kind}"
    assert f"{path} exists and is {kind_said}, not a socket: refusing to remove it; left in place" \
        in result.stderr
    assert _snapshot(tmp_path) == before


def test_a_dead_daemons_socket_is_replaced(tmp_path):
    path = tmp_path / "s.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: nobody answers
    dead.close()
    with ProxyDaemonProcess(socket_path=path) as own, connect(own) as client:
        client.open("x", "memory")


def test_a_live_daemons_socket_is_refused(daemon):
    result = subprocess.run([sys.executable, "-m", "dbwrap_py.proxy.daemon", "--socket", daemon.socket_path],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 1 and f"another daemon answers on {daemon.socket_path}" in result.stderr
    with connect(daemon) as client:
        client.open("x", "memory")


def test_sigterm_leaves_what_replaced_the_socket(tmp_path):
    """The daemon removes its own socket as it stops, not whatever sits at
    the path by then."""
    path = tmp_path / "s.sock"
    with ProxyDaemonProcess(socket_path=path) as own:
        path.unlink()
        path.write_text("not the daemon's")
        own.stop(signal.SIGTERM)
        assert path.read_text() == "not the daemon's"


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_peer_of_another_user_is_refused():
    place = Path(tempfile.mkdtemp(prefix="dbwrap-py-proxy-peer-"))
    try:
        place.chmod(0o755)
        with ProxyDaemonProcess(socket_path=place / "s.sock") as own:
            os.chmod(own.socket_path, 0o666)  # only the peer check is left to refuse
            probe = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(10);"
                     "s.connect(sys.argv[1]); print('eof' if s.recv(1) == b'' else 'data')")
            result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                     sys.executable, "-c", probe, own.socket_path],
                                    capture_output=True, text=True, timeout=TIMEOUT)
            assert result.stdout.strip() == "eof", result.stderr
            assert "refused pid" in own.log_text()
            with connect(own) as client:  # root still gets in
                client.open("x", "memory")
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_fuzz_leaves_the_daemon_alive_without_leaked_locks(daemon):
    report = fuzz(daemon.socket_path, seconds=2, seed=17)
    print(report)
    assert report.alive and not report.leaked
    assert report.cases > 10 and report.closed_by_daemon > 0 and report.locked_keys


def test_a_connection_that_never_speaks_does_not_block_others(daemon, name):
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(daemon.socket_path)
    idle.sendall(wire.LENGTH.pack(100) + b"\x01")  # half a frame, then silence
    try:
        with connect(daemon) as client:
            db = client.open(name, "memory")
            assert client.fetch(db, b"k") is None
    finally:
        idle.close()


def test_the_fuzzer_catches_a_daemon_that_leaks_locks(tmp_path, monkeypatch):
    """The broken example: a daemon that forgets a dead connection's holds."""
    import threading

    from dbwrap_py.proxy.daemon import ProxyDaemon
    from dbwrap_py.proxy.session import Session

    monkeypatch.setattr(Session, "_let_go", lambda self, shared: None)
    broken = ProxyDaemon(str(tmp_path / "broken.sock"))
    broken.bind()
    serving = threading.Thread(target=broken.serve, daemon=True)
    serving.start()
    try:
        report = fuzz(broken.socket_path, seconds=1, seed=5)
    finally:
        broken.stop()
        serving.join(TIMEOUT)
    assert report.alive and report.leaked, report


def test_locks_pass_between_connections_on_a_tdb_opened_with_mutexes(daemon, tmp_path):
    """smbd opens locking.tdb with TDB_MUTEX_LOCKING. A pthread mutex belongs
    to the thread that locked it, and a connection's UNLOCK may run on another
    worker than its LOCK: with mutexes the record stayed locked for good and
    the next LOCK hung (found by smbtorture over the proxy)."""
    path = str(tmp_path / "mutexed.tdb")
    flags = 4096 | 2048 | 1  # MUTEX_LOCKING, INCOMPATIBLE_HASH, CLEAR_IF_FIRST: as locking.tdb
    def busy(_: int) -> None:  # the pool grows a worker per concurrent request
        with connect(daemon) as c:
            db = c.open(path, "tdb", tdb_flags=flags)
            for _ in range(50):
                c.fetch(db, b"other")

    with connect(daemon) as a, connect(daemon) as b:
        db_a, db_b = a.open(path, "tdb", tdb_flags=flags), b.open(path, "tdb", tdb_flags=flags)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(busy, range(8)))
        for round_ in range(40):  # with several workers, LOCK and UNLOCK land on different ones
            for client, db in ((a, db_a), (b, db_b)):
                client.lock(db, b"k", wait_ms=3000)
                client.unlock(db, b"k", b"%d" % round_)
        assert a.fetch(db_a, b"k") == b"39"


def test_a_live_connection_keeps_a_leased_record_past_many_leases(daemon, tmp_path):
    """The daemon renews the leases of records its connections hold: one
    held for about seven leases still writes under its lock, and a process
    outside the daemon (another node, say) cannot take the lock meanwhile.
    Without the renewal the store is fenced out (FILE_LOCK_CONFLICT)."""
    from dbwrap_py.database import open_database
    from dbwrap_py.errors import Timeout

    path, options = str(tmp_path / "leased.tdb"), ["lease=0.3", "op_timeout=1"]
    with connect(daemon) as client:
        db = client.open(path, "sqlite_leased", options)
        client.lock(db, b"k")
        outside = open_database(path, 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "sqlite_leased",
                                options)
        try:
            time.sleep(1.0)
            with pytest.raises(Timeout):  # op_timeout: held all along
                outside.lock(b"k")
            client.store(db, b"k", b"written under a renewed lease")
            client.unlock(db, b"k")
            assert outside.fetch(b"k") == b"written under a renewed lease"
        finally:
            outside.close()


def test_a_database_opened_again_with_other_options_is_the_one_open(daemon, name, tmp_path):
    """smb.conf changed under running processes: the open database (its
    file, its record locks) serves the new ones too, with the options of
    its first open, as tdb keeps its first open's flags; the daemon says so.
    Two opens of one file would fight over it in one process."""
    path = str(tmp_path / f"{name}.tdb")
    with connect(daemon) as one, connect(daemon) as two:
        a = one.open(path, "tdb")
        b = two.open(path, "tdb", ["native_records=no"])
        one.lock(a, b"k")
        assert status_of(two.lock, b, b"k", 50) == nt.NT_STATUS_IO_TIMEOUT  # one lock table
        one.unlock(a, b"k", b"v")
        assert two.fetch(b, b"k") == b"v"
    assert f"{path}: opened again with other options (native_records=no)" in daemon.log_text()
