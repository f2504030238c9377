"""The throwaway Cassandra (python/dbwrap_py/testing/servers/cassandra.py) against real nodes.

A one-node cluster for CQL, auth and the CLI; a three-node one (RF 3) for
a node killed and brought back. The jars come from Maven once (the first
run downloads them); the download itself is tested with a stand-in for
Maven, so a failure and the lock need no network.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

cassandra = pytest.importorskip("cassandra", reason="cassandra-driver is not installed (tests/requirements.txt)")

from cassandra import ConsistencyLevel  # noqa: E402
from cassandra.auth import PlainTextAuthProvider  # noqa: E402
from cassandra.cluster import Cluster, NoHostAvailable, Session  # noqa: E402
from cassandra.query import SimpleStatement  # noqa: E402

from dbwrap_py.testing.servers import cassandra as _cassandra_server  # noqa: E402
from dbwrap_py.testing.servers.cassandra import CassandraCluster, CassandraError  # noqa: E402
from listening_sockets import listening  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.skipif(
    not (shutil.which("java") and shutil.which("mvn")),
    reason="no java or mvn (scripts/install-deps.sh installs openjdk-17-jre-headless and maven)")]


def connect(options: dict[str, str], **kwargs: object) -> tuple[Cluster, Session]:
    """A driver session the way a client of ``options`` makes one."""
    points = options["contact_points"].split(",")
    port = int(points[0].rsplit(":", 1)[1])
    if "user" in options and "auth_provider" not in kwargs:
        kwargs["auth_provider"] = PlainTextAuthProvider(options["user"], options["password"])
    cluster = Cluster([p.rsplit(":", 1)[0] for p in points], port=port, protocol_version=5,
                      connect_timeout=5, **kwargs)  # type: ignore[arg-type]
    return cluster, cluster.connect()


def alive(pid: int, root: Path) -> bool:
    """Whether ``pid`` is still the JVM of the node whose directory is ``root``."""
    try:
        return str(root) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@pytest.fixture
def timed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print how long the test took (pytest -s shows it; -q keeps it quiet)."""
    started = time.monotonic()
    yield
    print(f"\n{request.node.name}: {time.monotonic() - started:.1f} s")


def test_initial_tokens_split_the_ring_evenly():
    assert _cassandra_server.initial_token(0, 1) == 0
    tokens = [_cassandra_server.initial_token(i, 3) for i in range(3)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert all(-(1 << 63) < t < (1 << 63) for t in tokens)
    gaps = [b - a for a, b in zip(tokens, tokens[1:])] + [tokens[0] + (1 << 64) - tokens[-1]]
    assert max(gaps) - min(gaps) <= 2


def fake_maven(tmp_path: Path, script: str) -> dict[str, str]:
    """An environment whose ``mvn`` runs ``script`` and whose cache is in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\n" + script)
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_a_failed_download_says_why_and_leaves_nothing_behind(tmp_path, monkeypatch):
    for name, value in fake_maven(tmp_path, 'echo "[ERROR] Failed to resolve cassandra-all"; exit 1\n').items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CassandraError, match=r"(?s)exit 1.*\[ERROR\] Failed to resolve cassandra-all"):
        _cassandra_server.jars()
    cache = _cassandra_server.cache_dir()
    assert cache == tmp_path / "cache" / "dbwrap_py" / f"cassandra-{_cassandra_server.VERSION}"
    assert sorted(p.name for p in cache.iterdir()) == ["download.lock"]


def test_jars_are_downloaded_once_by_one_process_at_a_time(tmp_path, monkeypatch):
    """Two callers at once: one runs Maven, the other waits for its lock and
    takes the result; a call after that runs nothing."""
    calls = tmp_path / "calls"
    script = f"""\
echo run >> {calls}
for arg; do case "$arg" in -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}";; esac; done
mkdir -p "$out" && sleep 0.5 && : > "$out/cassandra-all-{_cassandra_server.VERSION}.jar"
"""
    for name, value in fake_maven(tmp_path, script).items():
        monkeypatch.setenv(name, value)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(_cassandra_server.jars())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lib = _cassandra_server.cache_dir() / "lib"
    assert results == [lib, lib]
    assert _cassandra_server.jars() == lib
    assert calls.read_text().split() == ["run"]
    assert sorted(p.name for p in lib.iterdir()) == [f"cassandra-all-{_cassandra_server.VERSION}.jar"]


def test_one_node_runs_cql_and_leaves_nothing_after_stop(timed):
    started = time.monotonic()
    cluster = CassandraCluster(nodes=1)
    cluster.start()
    try:
        print(f"\none node ready in {time.monotonic() - started:.1f} s, RSS {cluster.rss_kib()[0] // 1024} MiB")
        options = cluster.options()
        assert options == {"contact_points": f"127.0.0.1:{cluster.native_port}", "replication_factor": "1"}
        pid, root = cluster.pid(0), cluster.root(0)
        assert pid is not None and alive(pid, root)
        assert listening(pid) == sorted(f"127.0.0.1:{p}" for p in (cluster.storage_port, cluster.native_port))
        client, session = connect(options)
        try:
            session.execute("CREATE KEYSPACE ks WITH replication ="
                            " {'class': 'SimpleStrategy', 'replication_factor': 1}")
            session.execute("CREATE TABLE ks.t (k text PRIMARY KEY, v blob)")
            session.execute("INSERT INTO ks.t (k, v) VALUES (%s, %s)", ("hello", b"world\x00"))
            assert session.execute("SELECT v FROM ks.t WHERE k = %s", ("hello",)).one().v == b"world\x00"
            setting = session.execute("SELECT value FROM system_views.settings WHERE name = 'paxos_variant'")
            assert setting.one().value == "v2"
        finally:
            client.shutdown()
    finally:
        cluster.stop()
    assert not alive(pid, root)
    assert not root.exists()


def test_password_auth_and_paxos_v1(timed):
    with CassandraCluster(nodes=1, auth="password", paxos_variant="v1") as cluster:
        options = cluster.options()
        assert (options["user"], options["password"]) == ("cassandra", "cassandra")
        client, session = connect(options)
        try:
            setting = session.execute("SELECT value FROM system_views.settings WHERE name = 'paxos_variant'")
            assert setting.one().value == "v1"
        finally:
            client.shutdown()
        port = cluster.native_port
        for auth in (PlainTextAuthProvider("cassandra", "wrong"), None):
            stranger = Cluster(["127.0.0.1"], port=port, protocol_version=5, auth_provider=auth)
            try:
                with pytest.raises(NoHostAvailable, match="(?i)authenticat"):
                    stranger.connect()
            finally:
                stranger.shutdown()


def test_a_node_that_exits_at_start_is_explained(monkeypatch):
    """A node whose JVM cannot start: CassandraError at once, with its log
    tail, and its directory gone."""
    monkeypatch.setattr(_cassandra_server, "_jvm_options", lambda nodes, auth: "-Xmx256M\n-Xms512M\n")
    cluster = CassandraCluster(nodes=1)
    started = time.monotonic()
    with pytest.raises(CassandraError, match=r"(?s)node 0 \(127.0.0.1\) exited.*stdout.log.*heap") as failure:
        cluster.start()
    assert time.monotonic() - started < 30
    root = Path(re.search(r"(\S+)/logs/stdout.log", str(failure.value)).group(1))  # type: ignore[union-attr]
    assert root.name.startswith("dbwrap-py-cassandra-0-") and not root.exists()


@pytest.mark.full  # a three-node Cassandra: make test-full
def test_three_nodes_serve_quorum_with_one_killed_and_take_it_back(timed):
    started = time.monotonic()
    with CassandraCluster(nodes=3) as cluster:
        print(f"\nthree nodes ready in {time.monotonic() - started:.1f} s,"
              f" RSS {sorted(v // 1024 for v in cluster.rss_kib().values())} MiB")
        options = cluster.options()
        port = cluster.native_port
        assert options == {"contact_points": f"127.0.0.1:{port},127.0.0.2:{port},127.0.0.3:{port}",
                           "replication_factor": "3"}
        client, session = connect(options)
        try:
            session.execute("CREATE KEYSPACE ks WITH replication ="
                            " {'class': 'SimpleStrategy', 'replication_factor': 3}")
            session.execute("CREATE TABLE ks.t (k int PRIMARY KEY, v int)")
            insert = "INSERT INTO ks.t (k, v) VALUES (%s, %s)"
            select = "SELECT v FROM ks.t WHERE k = %s"
            quorum = ConsistencyLevel.QUORUM
            for k in range(20):
                session.execute(SimpleStatement(insert, consistency_level=quorum), (k, k))

            pid, root = cluster.pid(2), cluster.root(2)
            killed = time.monotonic()
            cluster.stop_node(2)
            assert cluster.pid(2) is None and not alive(pid, root)  # type: ignore[arg-type]
            # a write needs two replicas of three: it goes on while the
            # others still think node 2 up (a read may wait for it meanwhile)
            session.execute(SimpleStatement(insert, consistency_level=quorum), (100, 100))
            cluster.wait_down(2)  # then a read that needs node 2 fails at once, not by a timeout
            print(f"node 2 down for the others {time.monotonic() - killed:.1f} s after the kill")
            for k in [*range(20), 100]:
                row = session.execute(SimpleStatement(select, consistency_level=quorum), (k,)).one()
                assert row.v == k
            with pytest.raises(cassandra.Unavailable):
                session.execute(SimpleStatement(select, consistency_level=ConsistencyLevel.ALL), (0,))

            restarted = time.monotonic()
            cluster.start_node(2)
            print(f"node 2 back in {time.monotonic() - restarted:.1f} s")
            assert cluster.pid(2) not in (None, pid)
            for k in [*range(20), 100]:  # every replica answers, node 2 on its old data or repaired
                statement = SimpleStatement(select, consistency_level=ConsistencyLevel.ALL)
                assert session.execute(statement, (k,)).one().v == k
        finally:
            client.shutdown()
        roots = [cluster.root(i) for i in range(3)]
        pids = [cluster.pid(i) for i in range(3)]
    assert not any(alive(p, r) for p, r in zip(pids, roots) if p is not None)
    assert not any(r.exists() for r in roots)


def test_cli_runs_a_cluster_until_sigterm(timed):
    script = Path(sys.executable).with_name("dbwrap-py")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "dbwrap_py.cli"]
    server = subprocess.Popen([*argv, "cassandra", "--nodes", "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in server.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "SIGTERM" in line:
                break
        banner = "".join(lines)
        assert "-o contact_points=127.0.0.1:" in banner and "-o replication_factor=1" in banner, banner
        contact_points = banner.split("-o contact_points=", 1)[1].split()[0]
        pid = int(banner.split(" pid ", 1)[1].split()[0])
        root = Path(banner.split(" in ", 1)[1].split()[0].rstrip(";"))
        client, session = connect({"contact_points": contact_points})
        try:
            assert session.execute("SELECT release_version FROM system.local").one().release_version == \
                _cassandra_server.VERSION
        finally:
            client.shutdown()
    finally:
        server.send_signal(signal.SIGTERM)
        # 0, or SIGINT's status when SIGTERM lands between the banner and
        # serve_until_stopped's wait: the cluster is stopped either way
        assert server.wait(timeout=60) in (0, -signal.SIGINT)
    assert not alive(pid, root)
    assert not root.exists()
