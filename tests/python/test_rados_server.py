"""The throwaway Ceph (python/dbwrap_py/testing/servers/rados.py) against its real daemons.

One cluster per shape for the module: one OSD (pool size 1) and three OSDs
(size 3, min_size 2) for the faults: a SIGKILLed OSD, a stopped mon.
"""

from __future__ import annotations

import configparser
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.server


rados = pytest.importorskip("rados", reason="python3-rados (Debian) is not installed")

from dbwrap_py.testing.servers.rados import CephCluster, CephError  # noqa: E402
from listening_sockets import listening  # noqa: E402

#: seconds a test client waits for one op: short, so a fault shows as an error
OP_TIMEOUT = 2


@pytest.fixture(scope="module")
def ceph1() -> Iterator[CephCluster]:
    with CephCluster(osds=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ceph3() -> Iterator[CephCluster]:
    with CephCluster(osds=3) as cluster:
        yield cluster


def connect(cluster: CephCluster, timeout: int = OP_TIMEOUT) -> "rados.Rados":
    """A client the way the adapter makes one: the cluster's conf, short timeouts."""
    client = rados.Rados(conffile=cluster.options()["conf"], conf={
        "rados_osd_op_timeout": str(timeout),
        "rados_mon_op_timeout": str(timeout),
        "client_mount_timeout": str(timeout),
    })
    client.connect()
    return client


def alive(pid: int, conf: str) -> bool:
    """Whether ``pid`` is still a daemon of the cluster whose conf is ``conf``."""
    try:
        return conf in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def osd_up(cluster: CephCluster, name: str) -> bool:
    dump = json.loads(cluster.mon_command({"prefix": "osd dump", "format": "json"}))
    return any(f"osd.{o['osd']}" == name and o["up"] for o in dump["osds"])


def test_one_osd_cluster_takes_writes_and_reads(ceph1):
    options = ceph1.options()
    assert options == {"conf": ceph1.conf_path, "pool": "dbwrap_py"}
    assert ceph1.mon_host.startswith("[v2:127.0.0.1:")
    client = connect(ceph1)
    try:
        with client.open_ioctx(options["pool"]) as ioctx:
            ioctx.write_full("hello", b"world\x00")
            assert ioctx.read("hello") == b"world\x00"
            ioctx.remove_object("hello")
    finally:
        client.shutdown()


def test_conf_gives_clients_timeouts_and_no_admin_socket(ceph1):
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(ceph1.conf_path)
    client = conf["client"]
    assert client["admin socket"] == ""
    assert int(client["rados osd op timeout"]) > 0
    assert int(client["rados mon op timeout"]) > 0
    assert conf["global"]["mon host"] == ceph1.mon_host
    assert conf["global"]["ms bind msgr1"] == "false"


def test_daemons_listen_on_127_0_0_1_only(ceph1):
    for name in ceph1.daemons:
        pid = ceph1.pid_of(name)
        assert pid is not None
        addresses = listening(pid)
        assert addresses, f"{name} listens nowhere"
        assert all(a.startswith("127.0.0.1:") for a in addresses), (name, addresses)
    assert listening(ceph1.pid_of("mon.a")) == [f"127.0.0.1:{ceph1.mon_port}"]


def test_one_osd_restarts_after_sigterm_and_explains_a_crash():
    """One OSD: SIGTERM keeps its memstore objects over a restart; a crash
    loses them, and the cluster says so instead of hanging; stop then
    leaves no process and no directory behind."""
    cluster = CephCluster(osds=1)
    cluster.start()
    try:
        conf, root = cluster.conf_path, cluster.root
        client = connect(cluster)
        try:
            with client.open_ioctx(cluster.pool) as ioctx:
                ioctx.write_full("kept", b"1")
                cluster.stop_daemon("osd.0")  # SIGTERM
                cluster.start_daemon("osd.0")
                assert ioctx.read("kept") == b"1"
        finally:
            client.shutdown()
        pids = [cluster.pid_of(name) for name in ("mon.a", "osd.0")]
        assert all(pid is not None and alive(pid, conf) for pid in pids)
        os.kill(pids[1], signal.SIGKILL)  # behind the cluster's back: a crash
        started = time.monotonic()
        with pytest.raises(CephError, match="osd.0 exited") as failure:
            cluster.wait_healthy(timeout=10)
        assert time.monotonic() - started < 5
        assert "osd.0.log" in str(failure.value)  # the log tail explains the failure
        with pytest.raises(CephError, match="lost its memstore objects"):
            cluster.start_daemon("osd.0")
    finally:
        cluster.stop()
    assert root is not None and not root.exists()
    assert not any(alive(pid, conf) for pid in pids if pid is not None)


def test_cli_runs_a_cluster_until_sigterm():
    script = Path(sys.executable).with_name("dbwrap-py")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "dbwrap_py.cli"]
    server = subprocess.Popen([*argv, "ceph", "--osds", "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in server.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "SIGTERM" in line:
                break
        use = next(line for line in lines if "-o conf=" in line)
        conf = use.split("-o conf=", 1)[1].split()[0]
        assert "-o pool=dbwrap_py" in use
        client = rados.Rados(conffile=conf, conf={"rados_osd_op_timeout": str(OP_TIMEOUT)})
        client.connect()
        try:
            with client.open_ioctx("dbwrap_py") as ioctx:
                ioctx.write_full("cli", b"up")
        finally:
            client.shutdown()
    finally:
        server.send_signal(signal.SIGTERM)
        # 0, or SIGINT's status when SIGTERM lands between the banner and
        # serve_until_stopped's wait: the cluster is stopped either way
        assert server.wait(timeout=30) in (0, -signal.SIGINT)
    assert not Path(conf).exists()


def test_three_osds_keep_writing_with_one_killed(ceph3):
    client = connect(ceph3)
    try:
        with client.open_ioctx(ceph3.pool) as ioctx:
            for i in range(20):
                ioctx.write_full(f"k{i}", b"before")
            old_pid = ceph3.pid_of("osd.1")
            ceph3.stop_daemon("osd.1", sig=signal.SIGKILL)
            started = time.monotonic()
            for i in range(20):  # size 3, min_size 2: two replicas are enough
                ioctx.write_full(f"k{i}", b"during")
            assert time.monotonic() - started < 2 * OP_TIMEOUT
            while osd_up(ceph3, "osd.1"):  # peers see the refused connection
                assert time.monotonic() - started < 5, "the killed OSD is still up"
                time.sleep(0.05)
            ceph3.start_daemon("osd.1")
            assert ceph3.pid_of("osd.1") not in (None, old_pid)
            assert osd_up(ceph3, "osd.1")
            for i in range(20):
                assert ioctx.read(f"k{i}") == b"during"
                ioctx.write_full(f"k{i}", b"after")
    finally:
        client.shutdown()


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "T"


def soon(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Whether ``condition`` holds within ``timeout`` (a signal is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_pause_and_resume_by_pid(ceph3):
    pid = ceph3.pid_of("osd.2")
    assert pid is not None
    ceph3.pause_daemon("osd.2")
    try:
        assert soon(lambda: stopped(pid))
    finally:
        ceph3.resume_daemon("osd.2")
    assert soon(lambda: not stopped(pid))
    ceph3.wait_healthy(timeout=30)


def test_mon_stop_fails_mon_work_fast_and_a_restart_brings_it_back(ceph3):
    client = connect(ceph3)
    try:
        with client.open_ioctx(ceph3.pool) as ioctx:
            ioctx.write_full("m", b"1")
            ceph3.stop_daemon("mon.a")
            assert ceph3.pid_of("mon.a") is None
            # object I/O needs no mon: the OSD map the client holds is enough
            ioctx.write_full("m", b"2")
            started = time.monotonic()
            ret, _, _ = client.mon_command(json.dumps({"prefix": "osd dump", "format": "json"}), b"")
            assert ret == -110 and time.monotonic() - started < OP_TIMEOUT + 1  # ETIMEDOUT
            started = time.monotonic()
            with pytest.raises(rados.TimedOut):
                connect(ceph3)  # a new client needs the mon
            assert time.monotonic() - started < OP_TIMEOUT + 1
            ceph3.start_daemon("mon.a")  # same mon data: same fsid, maps and pool
            ret, _, _ = client.mon_command(json.dumps({"prefix": "osd dump", "format": "json"}), b"")
            assert ret == 0
            fresh = connect(ceph3)
            try:
                with fresh.open_ioctx(ceph3.pool) as other:
                    assert other.read("m") == b"2"
            finally:
                fresh.shutdown()
    finally:
        client.shutdown()
