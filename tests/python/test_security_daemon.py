"""Issue 39: a peer of the proxy daemon opens only what the daemon's --config allows.

Each test makes the attack through a real daemon (ProxyDaemonProcess, a
ProxyClient on its socket) and checks it is refused, naming the cause, and
that nothing changed on disk. Without the checks of
python/dbwrap_py/proxy/policy.py each of them fails: the open succeeds (a
secrets.tdb read, a database truncated, a module imported, a directory
made).
"""

from __future__ import annotations

import hashlib
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy.client import ProxyClient, ProxyError
from dbwrap_py.proxy.daemon import ProxyDaemonProcess
from dbwrap_py.servers import ServerError

RW_CREAT = os.O_RDWR | os.O_CREAT


class Node:
    """A daemon whose --config serves ``allowed`` only; ``private`` beside it
    holds a secrets.tdb the peer must never reach."""

    def __init__(self, tmp_path: Path) -> None:
        self.allowed = tmp_path / "lock"
        self.private = tmp_path / "private"
        self.allowed.mkdir(mode=0o755)
        self.private.mkdir(mode=0o700)
        self.secrets = self.private / "secrets.tdb"
        self.secrets.write_bytes(b"machine password: hunter2\n")
        self.config = tmp_path / "daemon.conf"
        write_config(self.config, f"""
            [daemon]
            directories = {self.allowed}

            [database cache*.tdb]
            adapter = etcd
            endpoints = http://127.0.0.1:9
            node_cache = write-back
            node_cache_dir = {self.allowed}/node-cache

            [database *.tdb]
            adapter = tdb
            """)

    def snapshot(self) -> dict[str, str]:
        """Every file under the test's directory and its content's hash (a
        link as its target): what must not change."""
        found = {}
        for root, dirs, files in os.walk(self.allowed.parent):
            for name in dirs + files:
                path = os.path.join(root, name)
                if os.path.islink(path):
                    found[path] = "-> " + os.readlink(path)
                elif os.path.isfile(path):
                    found[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                else:
                    found[path] = "dir"
        return found


def write_config(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Node, ProxyDaemonProcess]]:
    served = Node(tmp_path)
    with ProxyDaemonProcess(config=served.config) as daemon:
        yield served, daemon


def client_of(daemon: ProxyDaemonProcess) -> ProxyClient:
    client = ProxyClient(daemon.socket_path)
    client.hello()
    return client


def refused(daemon: ProxyDaemonProcess, name: str | Path, adapter: str = "tdb",
            options: tuple[str, ...] = (), open_flags: int = RW_CREAT, mode: int = 0o600) -> str:
    """The cause of the daemon's ACCESS_DENIED for this OPEN (the test fails if it opens)."""
    with client_of(daemon) as client, pytest.raises(ProxyError) as caught:
        client.open(str(name), adapter, options, open_flags=open_flags, mode=mode)
    assert caught.value.status == nt.NT_STATUS_ACCESS_DENIED, caught.value
    assert caught.value.cause in daemon.log_text(), daemon.log_text()  # and logged, naming the peer's OPEN
    return caught.value.cause


def test_a_database_inside_the_allowed_directory_opens(node: tuple[Node, ProxyDaemonProcess]) -> None:
    served, daemon = node
    with client_of(daemon) as client:
        db = client.open(str(served.allowed / "ok.tdb"), "tdb", open_flags=RW_CREAT, mode=0o4777)
        client.lock(db, b"k")
        client.unlock(db, b"k", b"v")
        assert client.fetch(db, b"k") == b"v"
    # the mode was capped: no set-id, sticky or execute bits (the daemon's umask may take more)
    assert (served.allowed / "ok.tdb").stat().st_mode & 0o7111 == 0


def test_secrets_tdb_outside_the_allowed_directories_is_refused(node: tuple[Node, ProxyDaemonProcess]) -> None:
    served, daemon = node
    before = served.snapshot()
    cause = refused(daemon, served.secrets)
    assert f"its directory {served.private} is outside the daemon's directories" in cause, cause
    assert served.snapshot() == before


GROUP_MEMBER = """
import json, os, pwd, grp, sys
from dbwrap_py.proxy.client import ProxyClient, ProxyError
socket_path, secrets, allowed, group = sys.argv[1:5]
# everything imported, become nobody with the group beside it (the checkout
# may sit where nobody cannot read, as /root/work/main in a fresh root)
os.setgroups([grp.getgrnam(group).gr_gid])
os.setgid(grp.getgrnam("nogroup").gr_gid)
os.setuid(pwd.getpwnam("nobody").pw_uid)
seen = {"uid": os.getuid(), "groups": os.getgroups()}
with ProxyClient(socket_path) as client:
    client.hello()
    try:
        client.open(secrets, "tdb", (), open_flags=os.O_RDWR | os.O_CREAT, mode=0o600)
        seen["secrets"] = "opened"
    except ProxyError as exc:
        seen["secrets"] = [exc.status, exc.cause]
    db = client.open(allowed, "tdb", (), open_flags=os.O_RDWR | os.O_CREAT, mode=0o600)
    client.lock(db, b"k")
    client.unlock(db, b"k", b"from the group")
    seen["allowed"] = client.fetch(db, b"k").decode()
print(json.dumps(seen))
"""


def test_a_group_member_may_connect_but_not_open_secrets_tdb(tmp_path: Path) -> None:
    """--group G: a member of G (here nobody, with G among its groups)
    reaches the socket, and the daemon's configuration still decides: the
    allowed directory's database opens, secrets.tdb beside it does not."""
    import grp
    import json
    import subprocess
    import sys

    group = grp.getgrgid(100).gr_name  # Debian's "users": nobody is not a member
    served = Node(tmp_path)
    for path in (tmp_path, served.allowed):  # nobody must reach the files the daemon names back
        path.chmod(0o755)
    before = served.snapshot()
    with ProxyDaemonProcess(group=group, config=served.config) as daemon:
        Path(daemon.dir).chmod(0o755)  # the socket itself is 0660 for the group
        run = subprocess.run([sys.executable, "-c", GROUP_MEMBER, daemon.socket_path, str(served.secrets),
                              str(served.allowed / "member.tdb"), group],
                             cwd="/", capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        seen = json.loads(run.stdout)
        assert seen["uid"] != 0 and 100 in seen["groups"]
        status, cause = seen["secrets"]
        assert status == nt.NT_STATUS_ACCESS_DENIED, seen
        assert f"its directory {served.private} is outside the daemon's directories" in cause, cause
        assert cause in daemon.log_text()
        assert seen["allowed"] == "from the group"
    after = served.snapshot()
    assert after.pop(str(served.allowed / "member.tdb"))  # the one database it was allowed
    assert after == before


def test_a_peer_named_module_is_never_imported(node: tuple[Node, ProxyDaemonProcess], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    served, daemon = node
    package = tmp_path / "planted" / "evil39"
    package.mkdir(parents=True)
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (package / "mod.py").write_text("ADAPTER = None\n")
    daemon.stop()  # again, with the planted package on its import path
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "planted"))
    daemon.start()
    cause = refused(daemon, served.allowed / "x.tdb", adapter="evil39.mod")
    assert "adapter 'evil39.mod' asked" in cause and "serves [database *.tdb] with 'tdb'" in cause, cause
    assert not marker.exists(), "the daemon imported a module the peer named"
    assert not (served.allowed / "x.tdb").exists()


def test_o_trunc_is_refused_and_the_database_keeps_its_records(node: tuple[Node, ProxyDaemonProcess]) -> None:
    served, daemon = node
    path = served.allowed / "kept.tdb"
    with client_of(daemon) as client:
        db = client.open(str(path), "tdb")
        client.lock(db, b"k")
        client.unlock(db, b"k", b"precious")
        client.close_db(db)
    before = served.snapshot()
    cause = refused(daemon, path, open_flags=os.O_RDWR | os.O_TRUNC)
    assert "open flags" in cause and "O_TRUNC" in cause, cause
    assert served.snapshot() == before
    with client_of(daemon) as client:
        assert client.fetch(client.open(str(path), "tdb"), b"k") == b"precious"


def test_dot_dot_out_of_the_allowed_directory_is_refused(node: tuple[Node, ProxyDaemonProcess]) -> None:
    served, daemon = node
    before = served.snapshot()
    cause = refused(daemon, f"{served.allowed}/../private/secrets.tdb")
    assert "holds '..'" in cause, cause
    assert served.snapshot() == before


@pytest.mark.parametrize("link", ["file", "directory"])
def test_a_symlink_out_of_the_allowed_directory_is_refused(node: tuple[Node, ProxyDaemonProcess],
                                                          link: str) -> None:
    served, daemon = node
    if link == "file":
        (served.allowed / "link.tdb").symlink_to(served.secrets)
        name, expected = served.allowed / "link.tdb", "is a symbolic link"
    else:
        (served.allowed / "sub").symlink_to(served.private)
        name, expected = served.allowed / "sub" / "secrets.tdb", "is outside the daemon's directories"
    before = served.snapshot()
    cause = refused(daemon, name)
    assert expected in cause, cause
    assert served.snapshot() == before


def test_node_cache_dir_outside_the_configured_one_is_refused(node: tuple[Node, ProxyDaemonProcess]) -> None:
    served, daemon = node
    elsewhere = served.private / "evil-cache"
    before = served.snapshot()
    cause = refused(daemon, served.allowed / "cache1.tdb", adapter="etcd",
                    options=("endpoints=http://127.0.0.1:9", "node_cache=write-back",
                             f"node_cache_dir={elsewhere}"))
    assert f"option node_cache_dir={elsewhere} sent" in cause and f"{served.allowed}/node-cache" in cause, cause
    assert not elsewhere.exists()
    assert served.snapshot() == before


def test_a_group_writable_config_stops_the_daemon_at_start(tmp_path: Path) -> None:
    served = Node(tmp_path)
    served.config.chmod(0o664)
    daemon = ProxyDaemonProcess(config=served.config)
    try:
        with pytest.raises(ServerError) as caught:
            daemon.start(timeout=10)
        assert f"{served.config} has mode 0664: group may write it; refused" in str(caught.value), caught.value
        assert not os.path.exists(daemon.socket_path)
    finally:
        daemon.__exit__(None, None, None)


def test_group_without_a_config_stops_the_daemon_at_start() -> None:
    import grp
    daemon = ProxyDaemonProcess(group=grp.getgrgid(os.getgid()).gr_name)
    try:
        with pytest.raises(ServerError) as caught:
            daemon.start(timeout=10)
        assert "give --config FILE" in str(caught.value), caught.value
    finally:
        daemon.__exit__(None, None, None)


def test_another_spelling_of_a_path_is_the_same_database(node: tuple[Node, ProxyDaemonProcess]) -> None:
    """A peer cannot get a second lock table on a file by writing its name otherwise."""
    served, daemon = node
    with client_of(daemon) as holder, client_of(daemon) as other:
        db = holder.open(str(served.allowed / "one.tdb"), "tdb")
        holder.lock(db, b"k")
        again = other.open(f"{served.allowed}//./one.tdb", "tdb")
        with pytest.raises(ProxyError):
            other.lock(again, b"k", wait_ms=200)
