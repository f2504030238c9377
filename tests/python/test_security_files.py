"""Issue 39, files: a local user without privileges tries to make root (smbd,
the node agent) follow a symbolic link or import code they planted. Each
test named for an attack performs it and shows it refused, with an error
naming the cause where there is something to refuse, and nothing changed on
disk; the others show what the rules must leave working.

The rules are ``dbwrap_py.safe_files``'s; ``start_python_module``
(``dbwrap_py.servers``) starts the FoundationDB helpers.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.adapters.sqlite_leased.nodestore import SqliteNodeStore
from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import UnsafePath
from dbwrap_py.nodecache.agent import NodeAgent, NodeAgentProcess
from dbwrap_py.nodecache.state import SIZE, STATE_FILE, NodeState, StateWriter
from dbwrap_py.safe_files import sqlite_file

RW = os.O_RDWR | os.O_CREAT
#: an unprivileged user's uid (Debian's nobody)
OTHER_UID = 65534


class Victim:
    """A file of root's that an attacker points a link at: its bytes, mode,
    owner and modification time are what must not change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"root's precious file\n")
        path.chmod(0o600)
        self.before = self.snapshot()

    def snapshot(self) -> tuple[bytes, int, int, int]:
        st = self.path.stat()
        return self.path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_mtime_ns

    def assert_unchanged(self) -> None:
        assert self.snapshot() == self.before, f"{self.path} was changed through a planted link"


@pytest.fixture
def victim(tmp_path: Path) -> Victim:
    return Victim(tmp_path / "victim")


def cache_dir(tmp_path: Path, mode: int = 0o755) -> Path:
    directory = tmp_path / "node-cache"
    directory.mkdir()
    directory.chmod(mode)
    return directory


def listing(directory: Path) -> dict[str, tuple[int, int, int]]:
    """What is in ``directory``: each name's lstat mode (type and permissions), owner and size."""
    return {p.name: (p.lstat().st_mode, p.lstat().st_uid, p.lstat().st_size) for p in directory.iterdir()}


# -- 1. the node cache's state file ------------------------------------------------------


def test_links_at_the_state_files_old_temp_name_and_at_the_state_file_are_not_followed(
        tmp_path: Path, victim: Victim) -> None:
    """The agent wrote node.state through ``node.new.<pid>`` with open() and
    chmod(), both following links: a link there made root overwrite the
    victim with zeros and make it world-readable."""
    directory = cache_dir(tmp_path)
    old_temp = directory / f"node.new.{os.getpid()}"  # what StateWriter(pid) used to write
    old_temp.symlink_to(victim.path)
    (directory / STATE_FILE).symlink_to(victim.path)
    writer = StateWriter(directory, b"node0")
    try:
        victim.assert_unchanged()
        assert old_temp.is_symlink() and os.readlink(old_temp) == str(victim.path), "the planted link is left alone"
        state = (directory / STATE_FILE).lstat()
        assert stat.S_ISREG(state.st_mode), "the link at node.state was replaced by the agent's own file"
        assert stat.S_IMODE(state.st_mode) == 0o644 and state.st_size == SIZE
        writer.publish(7, 1e12)
        reader = NodeState(str(directory))
        assert reader.agent_pid() == os.getpid() and reader.node_name() == b"node0"
        reader.close()
        assert sorted(p.name for p in directory.iterdir()) == sorted([STATE_FILE, old_temp.name]), \
            "no temp file left"
    finally:
        writer.remove()
    victim.assert_unchanged()


# -- 2. agent.lock ----------------------------------------------------------------------------


def sqlite_store(tmp_path: Path) -> SqliteNodeStore:
    """A node store that needs no server (sqlite_leased's cluster file)."""
    return SqliteNodeStore(str(tmp_path / "sqlite_leased.cluster"), op_timeout=5.0)


def test_a_link_at_agent_lock_makes_the_agent_refuse_to_start(tmp_path: Path, victim: Victim) -> None:
    directory = cache_dir(tmp_path)
    (directory / "agent.lock").symlink_to(victim.path)
    before = listing(directory)
    agent = NodeAgent(sqlite_store(tmp_path), directory, "node0")
    with pytest.raises(UnsafePath, match=r"agent\.lock is a symbolic link \(to .*victim\): refused"):
        agent.start()
    victim.assert_unchanged()
    assert listing(directory) == before, "no state file, nothing else made"
    assert not (tmp_path / "sqlite_leased.cluster").exists(), "no node lease taken"


def agent_command(tmp_path: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    """``dbwrap-py node-agent`` on ``directory``, expected to exit at once
    (an agent that started would be stopped by the timeout)."""
    return subprocess.run([sys.executable, "-m", "dbwrap_py.nodecache.agent", "--adapter", "sqlite_leased",
                           "--cache-dir", str(directory), "--node", "node0",
                           "-o", f"cluster_file={tmp_path / 'sqlite_leased.cluster'}"],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)


def test_a_link_at_agent_lock_makes_the_agent_command_exit_naming_it(tmp_path: Path, victim: Victim) -> None:
    directory = cache_dir(tmp_path)
    (directory / "agent.lock").symlink_to(victim.path)
    run = agent_command(tmp_path, directory)
    assert run.returncode == 1
    assert f"dbwrap-py node-agent: {directory / 'agent.lock'} is a symbolic link" in run.stderr
    victim.assert_unchanged()
    assert sorted(p.name for p in directory.iterdir()) == ["agent.lock"]


def test_the_agents_lock_file_is_its_own_and_not_inherited(tmp_path: Path) -> None:
    """What the refusals above leave working: an agent on a safe directory
    starts, its lock a regular file of mode 0600 that no child inherits."""
    directory = cache_dir(tmp_path)
    agent = NodeAgent(sqlite_store(tmp_path), directory, "node0", ttl=5)
    agent.start()
    try:
        lock = (directory / "agent.lock").lstat()
        assert stat.S_ISREG(lock.st_mode) and stat.S_IMODE(lock.st_mode) == 0o600
        assert not os.get_inheritable(agent._lockfile), "O_CLOEXEC: a child the agent starts holds no lock"
    finally:
        agent.stop()
        agent.run()  # drains and stops at once


# -- 3. the cache directory ---------------------------------------------------------------


def open_cached(tmp_path: Path, directory: Path) -> Database:
    return open_database(str(tmp_path / "locking.tdb"), 0, TDB_CLEAR_IF_FIRST, RW, 0o600, 0, 0, "sqlite_leased",
                         ["node_cache=yes", f"node_cache_dir={directory}",
                          f"cluster_file={tmp_path / 'sqlite_leased.cluster'}"])


def assert_cache_dir_refused(tmp_path: Path, directory: Path, cause: str) -> None:
    """The agent, the agent's command, NodeAgentProcess and a process opening
    a database with the directory as node_cache_dir all refuse it, naming it
    and ``cause``; nothing in it or about it changes, and the database's
    store is not opened (a volatile database's first open wipes it)."""
    before = directory.stat()
    message = f"node cache directory {directory} {cause}"
    with pytest.raises(UnsafePath, match=message):
        NodeAgent(sqlite_store(tmp_path), directory, "node0").start()
    with pytest.raises(UnsafePath, match=message):
        NodeAgentProcess("sqlite_leased", {"cluster_file": str(tmp_path / "sqlite_leased.cluster")},
                         directory).start()
    with pytest.raises(UnsafePath, match=message):
        open_cached(tmp_path, directory)
    assert list(directory.iterdir()) == [], "no lock, state file, log or local tdb made in it"
    after = directory.stat()
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid), "refused as it was, not repaired"
    assert not (tmp_path / "locking.tdb.sqlite").exists(), "the database's store was not opened"
    assert not (tmp_path / "sqlite_leased.cluster").exists()


def test_a_world_writable_cache_dir_is_refused(tmp_path: Path) -> None:
    directory = cache_dir(tmp_path, 0o777)
    assert_cache_dir_refused(tmp_path, directory, r"is writable by group and others \(mode 0777\): refused")
    run = agent_command(tmp_path, directory)
    assert run.returncode == 1
    assert f"dbwrap-py node-agent: node cache directory {directory} is writable" in run.stderr
    assert list(directory.iterdir()) == []


def test_a_group_writable_cache_dir_is_refused(tmp_path: Path) -> None:
    directory = cache_dir(tmp_path, 0o775)
    assert_cache_dir_refused(tmp_path, directory, r"is writable by group \(mode 0775\): refused")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user takes root")
def test_a_cache_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    directory = cache_dir(tmp_path, 0o755)
    os.chown(directory, OTHER_UID, OTHER_UID)
    assert_cache_dir_refused(tmp_path, directory, rf"is owned by uid {OTHER_UID}, not by root: refused")


# -- 4. the sqlite adapters' files -------------------------------------------------------


def sqlite_files(tmp_path: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.lstat().st_mode) for p in tmp_path.iterdir() if ".sqlite" in p.name
            or p.name.startswith("sqlite_leased.cluster")}


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=lambda m: f"umask-{m:03o}")
@pytest.mark.parametrize("mode", [0o600, 0o640], ids=oct)
@pytest.mark.parametrize("adapter", ["sqlite", "sqlite_leased"])
def test_sqlite_files_get_the_mode_samba_asks_for(tmp_path: Path, adapter: str, mode: int, umask: int) -> None:
    """Samba asks for a mode in db_open; the adapters made their files 0644
    less the umask (SQLite's default) whatever it asked. The mode is exact
    under any umask: smbd runs with umask 0, so its files get exactly the
    mode asked, whichever process (smbd, the proxy daemon) makes them."""
    name = str(tmp_path / "locking.tdb")
    old_umask = os.umask(umask)
    try:
        db = open_database(name, 0, TDB_CLEAR_IF_FIRST, RW, mode, 0, 0, adapter, [])
        db.lock(b"k")
        db.unlock(b"k", b"v")  # a write: SQLite's -wal and -shm exist while it is open
        found = sqlite_files(tmp_path)
        db.close()
    finally:
        os.umask(old_umask)
    expected = {f"locking.tdb.sqlite{suffix}": mode for suffix in ("", "-wal", "-shm")}
    if adapter == "sqlite":
        expected["locking.tdb.sqlite.locks"] = mode
    else:  # the opener lock, and the cluster file its first opener made
        expected["locking.tdb.sqlite.openers"] = mode
        expected.update({f"sqlite_leased.cluster{suffix}": mode for suffix in ("", "-wal", "-shm")})
    assert {k: oct(v) for k, v in found.items()} == {k: oct(v) for k, v in expected.items()}


@pytest.mark.parametrize("planted", [".sqlite", ".sqlite-wal", ".sqlite-journal", ".sqlite.locks"])
def test_a_link_planted_at_a_sqlite_file_is_refused(tmp_path: Path, victim: Victim, planted: str) -> None:
    name = str(tmp_path / "locking.tdb")
    Path(name + planted).symlink_to(victim.path)
    before = listing(tmp_path)
    with pytest.raises(UnsafePath, match=rf"locking\.tdb{planted} is a symbolic link \(to .*victim\): refused"):
        open_database(name, 0, TDB_CLEAR_IF_FIRST, RW, 0o600, 0, 0, "sqlite", [])
    victim.assert_unchanged()
    if planted != ".sqlite.locks":  # the lock file is opened after the database
        assert listing(tmp_path) == before, "nothing made beside the link"


def test_a_link_planted_at_sqlite_leaseds_cluster_file_is_refused(tmp_path: Path, victim: Victim) -> None:
    (tmp_path / "sqlite_leased.cluster").symlink_to(victim.path)
    with pytest.raises(UnsafePath, match=r"sqlite_leased\.cluster is a symbolic link"):
        open_database(str(tmp_path / "locking.tdb"), 0, TDB_CLEAR_IF_FIRST, RW, 0o600, 0, 0, "sqlite_leased", [])
    victim.assert_unchanged()


def test_naming_an_open_sqlite_file_again_keeps_this_processs_sqlite_locks(tmp_path: Path) -> None:
    """The check of an existing file must not open it: closing that
    descriptor would drop the fcntl locks this process's SQLite connections
    hold on it, and another process closing its connection would take
    itself for the last, checkpoint, and delete the WAL under them."""
    path = str(tmp_path / "locking.tdb.sqlite")
    conn = sqlite3.connect(sqlite_file(path, 0o600), isolation_level=None)
    conn.executescript("PRAGMA journal_mode=WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);")
    assert sqlite_file(path, 0o600) == path  # as a second database's ATTACH, or a reconnect after fork, does
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                    "c.execute('SELECT * FROM t').fetchall(); c.close()", path], check=True, timeout=30)
    assert os.path.exists(path + "-wal"), "another process took its connection for the last one"
    conn.close()


# -- 5. the FoundationDB helpers -----------------------------------------------------------

#: run with -I, so this driver itself imports nothing from the planted directory
START_BOTH_HELPERS = """
import os, sys
from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.adapters.fdb import library as library
from dbwrap_py.database import open_database
cluster_file, name = sys.argv[1:]
db = open_database(name, 0, TDB_CLEAR_IF_FIRST, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "fdb",
                   ["fdb_library=model", "cluster_file=" + cluster_file])
db.adapter.lock_get(b"k")                  # no network here yet: the opener keeper runs it
db.adapter.put_unlock(b"k", b"v")
print(type(db.adapter.store()).__name__, flush=True)
library.open_database(library.load("model", library.DEFAULT_API_VERSION), "model", cluster_file)
pid = os.fork()
if pid == 0:                                # forked after the network started: a relay runs it
    print(type(db.adapter.store()).__name__, db.adapter.get(b"k"), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
db.close()
"""
#: modules the helpers import (their package, __future__, the stdlib's), each
#: leaving the marker when imported
PLANTED = ("dbwrap_py.py", "__future__.py", "struct.py", "select.py", "json.py")


@pytest.mark.server
def test_modules_planted_in_the_current_directory_are_not_imported_by_the_fdb_helpers(tmp_path: Path) -> None:
    """smbd's processes work in share directories their users write. The
    opener keeper and the relay were ``python -m`` in the process's
    directory, which Python puts first on sys.path: a planted module ran as
    root there."""
    from dbwrap_py.testing.fdb_model.throwaway import model_server

    planted = tmp_path / "share"
    planted.mkdir()
    marker = tmp_path / "planted-module-ran"
    for module in PLANTED:
        (planted / module).write_text(f"open({str(marker)!r}, 'a').write(__name__ + ' imported\\n')\n")
    with model_server() as cluster_file:
        # named relative to the process's directory, as smb.conf may: the helpers run in / now
        (planted / "fdb.cluster").write_text(cluster_file.read_text())
        run = subprocess.run([sys.executable, "-I", "-c", START_BOTH_HELPERS, "fdb.cluster",
                              str(tmp_path / "locking.tdb")], cwd=planted, capture_output=True, text=True,
                             timeout=120)
    assert not marker.exists(), f"a planted module ran in a helper: {marker.read_text()}"
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["KeeperStore", "RelayStore b'v'"], "both helpers ran"
