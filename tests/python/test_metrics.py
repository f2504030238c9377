"""Prometheus metrics of the node agent and the proxy daemon, and
``dbwrap-py status``.

The agents run on sqlite_leased (no server: its node leases and release
requests live in one SQLite file of the test's); the daemon on the memory
adapter. Every process is stopped by PID (NodeAgentProcess,
ProxyDaemonProcess); every wait is a bounded loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import ConfigError
from dbwrap_py.metrics import AGENT_METRICS_FILE, parse_listen
from dbwrap_py.nodecache.agent import NodeAgentProcess
from dbwrap_py.nodecache.state import NodeState
from dbwrap_py.proxy.client import ProxyClient
from dbwrap_py.proxy.daemon import ProxyDaemonProcess

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

TTL = 3  # keepalives a second apart
TIMEOUT = 15.0  # no wait here lasts longer
RW = os.O_RDWR | os.O_CREAT

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample at ``url``, by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {TIMEOUT:g} s"
        time.sleep(0.1)


def listening(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses ``pid`` listens on (its sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # TCP_LISTEN
                    addr, port = local.split(":")
                    if table == "tcp":
                        host = ".".join(str(b) for b in reversed(bytes.fromhex(addr)))
                    else:
                        host = addr  # shown raw: it is never ours
                    found.append((host, int(port, 16)))
    return found


# -- the node agent --------------------------------------------------------------------

@pytest.fixture
def cluster_options(tmp_path: Path) -> dict[str, str]:
    return {"cluster_file": str(tmp_path / "cluster.sqlite"), "lease": str(TTL), "op_timeout": "5"}


@pytest.fixture
def nodes(cluster_options: dict[str, str], tmp_path: Path) -> Iterator[tuple[NodeAgentProcess, NodeAgentProcess]]:
    with NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-a", node="a", ttl=TTL,
                          metrics_port="0") as a, \
            NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-b", node="b", ttl=TTL,
                             metrics_port="0") as b:
        yield a, b


def open_on(options: dict[str, str], node: NodeAgentProcess, name: str) -> Database:
    opts = {"node_cache": "yes", "node_cache_dir": str(node.cache_dir), **options}
    return open_database(name, 0, TDB_CLEAR_IF_FIRST, RW, 0o600, 0, 0, "sqlite_leased",
                         [f"{k}={v}" for k, v in opts.items()])


AGENT_METRICS = [
    "dbwrap_py_node_agent_release_requests_served_total",
    "dbwrap_py_node_agent_records_handed_back_total",
    "dbwrap_py_node_agent_records_written_through_total",
    "dbwrap_py_node_agent_lease_renewals_total",
    "dbwrap_py_node_agent_lease_renewal_failures_total",
    "dbwrap_py_node_agent_lease_regrants_total",
    "dbwrap_py_node_agent_pending_release_requests",
    "dbwrap_py_node_agent_owned_records",
    "dbwrap_py_node_agent_owned_buckets",
    "dbwrap_py_node_agent_lease_valid_seconds",
    "dbwrap_py_node_agent_lease_renewal_seconds_count",
    "dbwrap_py_node_agent_lease_renewal_seconds_sum",
    "dbwrap_py_node_agent_release_request_seconds_count",
    "dbwrap_py_node_agent_release_request_seconds_sum",
]


def test_node_agent_counters_move_with_takes_hand_overs_and_hand_backs(nodes, cluster_options, tmp_path):
    a, b = nodes
    url_a, url_b = a.metrics_url(), b.metrics_url()
    before_a, before_b = scrape(url_a), scrape(url_b)
    names = {name for name, _ in before_a}
    assert set(AGENT_METRICS) <= names, sorted(set(AGENT_METRICS) - names)
    assert value(before_a, "dbwrap_py_node_agent_lease_valid_seconds") > 0

    name = str(tmp_path / "locking.tdb")
    on_a = open_on(cluster_options, a, name)
    for i in range(5):  # node a takes them: its bucket(s) claimed
        on_a.lock(b"k-%d" % i)
        on_a.unlock(b"k-%d" % i, b"x")
    wait_for("node a's agent counts what the node owns",
             lambda: value(scrape(url_a), "dbwrap_py_node_agent_owned_buckets") > 0)

    on_b = open_on(cluster_options, b, name)
    for i in range(5):  # node b asks node a for each: a's agent hands them over
        key = b"k-%d" % i
        assert on_b.lock(key) == b"x"
        on_b.delete(key)
        on_b.unlock(key)
    # node b's agent hands the deleted records back; both leases are renewed
    wait_for("the counters move", lambda: (
        value(scrape(url_a), "dbwrap_py_node_agent_release_requests_served_total")
        > value(before_a, "dbwrap_py_node_agent_release_requests_served_total")
        and value(scrape(url_b), "dbwrap_py_node_agent_records_handed_back_total")
        > value(before_b, "dbwrap_py_node_agent_records_handed_back_total")
        and value(scrape(url_a), "dbwrap_py_node_agent_lease_renewals_total")
        > value(before_a, "dbwrap_py_node_agent_lease_renewals_total")
        and value(scrape(url_a), "dbwrap_py_node_agent_lease_renewal_seconds_count")
        > value(before_a, "dbwrap_py_node_agent_lease_renewal_seconds_count")))
    after_a = scrape(url_a)
    assert value(after_a, "dbwrap_py_node_agent_lease_regrants_total") == 0  # no lease lapsed
    wait_for("each request served is timed", lambda: (
        (now := scrape(url_a))[("dbwrap_py_node_agent_release_requests_served_total", ())]
        == now[("dbwrap_py_node_agent_release_request_seconds_count", ())]))  # both from 0
    on_b.close()
    on_a.close()


def test_agent_metrics_are_off_unless_asked(cluster_options, tmp_path):
    with NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-c", node="c", ttl=TTL) as agent:
        assert agent.pid is not None
        assert listening(agent.pid) == []
        assert not (agent.cache_dir / AGENT_METRICS_FILE).exists()


def test_agent_metrics_listen_on_127_0_0_1_only_and_are_read_only(nodes):
    a, _ = nodes
    assert a.pid is not None
    [(host, port)] = listening(a.pid)
    assert host == "127.0.0.1"
    assert a.metrics_url() == f"http://127.0.0.1:{port}/metrics"
    request = urllib.request.Request(a.metrics_url(), data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=TIMEOUT)
    assert refused.value.code == 405


def test_agent_stops_its_metrics_with_it(cluster_options, tmp_path):
    agent = NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-d", node="d", ttl=TTL,
                             metrics_port="0")
    with agent:
        url = agent.metrics_url()
        assert scrape(url)
    assert not (agent.cache_dir / AGENT_METRICS_FILE).exists()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=TIMEOUT)


# -- dbwrap-py status ---------------------------------------------------------------------

def status(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dbwrap_py.cli", "status", "--cache-dir", str(cache_dir)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_status_prints_the_lease_and_the_agents_counters(nodes):
    a, _ = nodes
    state = NodeState(str(a.cache_dir))
    try:
        lease = state.current()[0]
    finally:
        state.close()
    assert lease
    shown = status(a.cache_dir)
    assert shown.returncode == 0, shown.stderr
    assert "node a: agent pid" in shown.stdout
    assert f"lease {lease:x}: valid for" in shown.stdout
    assert a.metrics_url() in shown.stdout
    assert "owned records:" in shown.stdout and "pending release requests:" in shown.stdout


def test_status_without_metrics_shows_the_lease(cluster_options, tmp_path):
    with NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-e", node="e", ttl=TTL) as agent:
        shown = status(agent.cache_dir)
    assert shown.returncode == 0, shown.stderr
    assert "valid for" in shown.stdout and "metrics: not served" in shown.stdout


def test_status_of_a_directory_without_an_agent_says_so(tmp_path):
    shown = status(tmp_path)
    assert shown.returncode == 1
    assert f"no node agent serves {tmp_path}" in shown.stderr


# -- the proxy daemon --------------------------------------------------------------------

def connect(daemon: ProxyDaemonProcess) -> ProxyClient:
    client = ProxyClient(daemon.socket_path, TIMEOUT)
    client.hello()
    return client


def test_daemon_counters_move_with_requests_and_lock_waits():
    with ProxyDaemonProcess(metrics_port="0") as daemon, ThreadPoolExecutor(max_workers=1) as background:
        url = daemon.metrics_url()
        before = scrape(url)
        for name in ("dbwrap_py_proxy_lock_waits_total", "dbwrap_py_proxy_lock_wait_seconds_total",
                     "dbwrap_py_proxy_connected_clients", "dbwrap_py_proxy_open_databases"):
            assert any(sample == name for sample, _ in before), name
        with connect(daemon) as one, connect(daemon) as two:
            a, b = one.open("metrics-db", "memory"), two.open("metrics-db", "memory")
            one.lock(a, b"k")
            waiter = background.submit(two.lock, b, b"k")
            wait_for("the second LOCK parks", lambda: value(scrape(url), "dbwrap_py_proxy_lock_waits_total")
                     > value(before, "dbwrap_py_proxy_lock_waits_total"))
            one.unlock(a, b"k", b"v")
            assert waiter.result(TIMEOUT) == b"v"
            two.unlock(b, b"k")
            assert one.fetch(a, b"k") == b"v"
            during = scrape(url)
            assert value(during, "dbwrap_py_proxy_connected_clients") >= 2
            assert value(during, "dbwrap_py_proxy_open_databases") >= 1
        after = scrape(url)
        for op in ("OPEN", "LOCK", "UNLOCK", "FETCH"):
            assert value(after, "dbwrap_py_proxy_requests_total", op=op) > \
                value(before, "dbwrap_py_proxy_requests_total", op=op), op
        for op in ("LOCK", "UNLOCK", "FETCH"):
            assert value(after, "dbwrap_py_proxy_adapter_calls_total", op=op) > \
                value(before, "dbwrap_py_proxy_adapter_calls_total", op=op), op
        assert value(after, "dbwrap_py_proxy_lock_wait_seconds_total") > \
            value(before, "dbwrap_py_proxy_lock_wait_seconds_total")
        wait_for("the connections are gone", lambda: value(scrape(url), "dbwrap_py_proxy_connected_clients") == 0)


def test_daemon_counts_the_node_caches_takes_and_moves_in(cluster_options, tmp_path):
    """Through the daemon, a node cache's takes: a bucket claimed by LOCK,
    a record taken one by one by MOVE_IN (its bucket another node's)."""
    with NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-a", node="a", ttl=TTL) as a, \
            NodeAgentProcess("sqlite_leased", cluster_options, tmp_path / "node-b", node="b", ttl=TTL) as b, \
            ProxyDaemonProcess(metrics_port="0") as daemon:
        url = daemon.metrics_url()
        before = scrape(url)
        name = str(tmp_path / "locking.tdb")
        on_a = open_on(cluster_options, a, name)
        on_a.lock(b"k")  # node a claims k's bucket
        on_a.unlock(b"k", b"v")
        opts = {"node_cache": "yes", "node_cache_dir": str(b.cache_dir), **cluster_options}
        with connect(daemon) as client:
            db = client.open(name, "sqlite_leased", [f"{k}={v}" for k, v in opts.items()],
                             tdb_flags=TDB_CLEAR_IF_FIRST)
            assert client.lock(db, b"mine") is None  # node b claims its bucket
            client.unlock(db, b"mine", b"x")
            wait_for("node a hands k over", lambda: client.move_in(db, b"k"))
            client.close_db(db)
        on_a.close()
        after = scrape(url)
    assert value(after, "dbwrap_py_proxy_node_cache_takes_total", what="bucket") > \
        value(before, "dbwrap_py_proxy_node_cache_takes_total", what="bucket")
    assert value(after, "dbwrap_py_proxy_node_cache_takes_total", what="record") > \
        value(before, "dbwrap_py_proxy_node_cache_takes_total", what="record")
    assert value(after, "dbwrap_py_proxy_requests_total", op="MOVE_IN") > \
        value(before, "dbwrap_py_proxy_requests_total", op="MOVE_IN")


def test_daemon_metrics_are_off_unless_asked_and_on_127_0_0_1_only():
    with ProxyDaemonProcess() as daemon:
        assert daemon.pid is not None
        assert listening(daemon.pid) == []
    with ProxyDaemonProcess(metrics_port="0") as daemon:
        assert daemon.pid is not None
        [(host, port)] = listening(daemon.pid)
        assert host == "127.0.0.1"
        assert daemon.metrics_url() == f"http://127.0.0.1:{port}/metrics"


# -- without the library, and the option's syntax -----------------------------------------

def test_without_prometheus_client_only_the_metrics_option_fails(tmp_path):
    """The daemon and the agent import the library only for --metrics-port."""
    code = f"""
import sys
sys.modules["prometheus_client"] = None  # as if not installed
import dbwrap_py.nodecache.agent, dbwrap_py.proxy.daemon
from dbwrap_py.proxy.daemon import main
sys.exit(main(["--socket", {str(tmp_path / "proxy.sock")!r}, "--metrics-port", "0"]))
"""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert ran.returncode == 1
    assert "python3-prometheus-client" in ran.stderr
    assert not (tmp_path / "proxy.sock").exists()
    imported = subprocess.run([sys.executable, "-c", "import sys, dbwrap_py.nodecache.agent, "
                               "dbwrap_py.proxy.daemon, dbwrap_py.cli; print('prometheus_client' in sys.modules)"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert imported.stdout.strip() == "False", imported.stderr


def test_metrics_port_takes_a_port_or_an_address_and_a_port():
    assert parse_listen("9123") == ("127.0.0.1", 9123)
    assert parse_listen("0.0.0.0:9123") == ("0.0.0.0", 9123)
    assert parse_listen("[::1]:9123") == ("::1", 9123)
    for bad in ("x", "70000", "127.0.0.1:"):
        with pytest.raises(ConfigError):
            parse_listen(bad)
