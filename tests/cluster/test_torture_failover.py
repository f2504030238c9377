"""smbtorture's failover suites on the three-node cluster (Samba 4.25):
the client connects to ctdb's public address; the node serving it stops
itself through ctdb, the address moves to another node, and the client
reclaims its persistent handle there.

What smbtorture does (source4/torture/smb2/util.c, durable_v2_open.c):
``torture_stop_ctdb_node`` asks the serving smbd for its PNN
(FSCTL_SMBTORTURE_GET_CTDB_PNN) and to stop it (FSCTL_SMBTORTURE_STOP_CTDB_NODE:
smbd runs ``clusteredmember:stop_node <pnn>``, here ``ctdb -n <pnn> stop``),
then sends the suicide packet: that smbd exits at once, without cleanup,
leaving the persistent open behind. ctdb releases the public address on
the stopped node and takes it over on another; the client connects to the
same address again, now another node, and reconnects its handle (DH2C).
At the end it continues the node (``ctdb continue``) through the node it
reached.

- ``smb2.persistent-open-failover``: failover-reconnect, one handle with an
  R lease, reclaimed with its lease (epoch 101).
- ``smb2.persistent-open-reconnect-contended.reconnect-contended-failover``:
  six rounds (a stop and a continue each) of a disconnected persistent
  handle that a second client contends for on the new node, refused with
  STATUS_FILE_NOT_AVAILABLE, before the owner reconnects. Samba's own
  selftest skips the whole suite in its cluster (selftest/skip).

Configurations: ctdb keeping every database (the baseline), and
smbXsrv_open_global, locking.tdb and brlock.tdb on etcd through the node
cache, each with the public address, and each as Samba's selftest runs
these suites: no public address, smbtorture given every node's address
(--unclist), each new connection going to the next node in the list. The
same databases on rados and cassandra through the node cache, selftest's
way only (their throwaway servers listen on 127.0.0.1 alone).
Each subtest must report success, except reconnect-contended-failover with
a public address: an xfail when it fails as CONTENDED_RESET says, a
failure when it fails otherwise or passes. ``-s`` prints each one's time.
Before Samba 4.25 there are no persistent handles: the module skips.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

import pytest

from dbwrap_py.cluster.ctdb import node_states
from dbwrap_py.cluster.processes import still_running
from dbwrap_py.cluster.samba_cluster import SambaCluster, persistent_handle_setup
from dbwrap_py.paths import built_samba_release
from dbwrap_py.samba import TEST_PASSWORD, TEST_USER
from dbwrap_py.smbtorture import parse_results, unclist_command, write_unclist

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in built_samba_release().split(".")) < (4, 25, 0),
    reason=f"Samba {built_samba_release()} has no persistent handles (from 4.25)")

_FAILOVER = dict(public_address=True, torture_node_control=True)
CONFIGURATIONS = {
    "ctdb": persistent_handle_setup(**_FAILOVER),
    # Samba's selftest's line (selftest/target/Samba3.pm, clusteredmember): no
    # public address; smbtorture's --unclist sends each connection to the next
    # node (a smbd on a stopped node takes no new connection)
    "ctdb-node-address": persistent_handle_setup(torture_node_control=True),
    "etcd-node-cache-node-address": persistent_handle_setup("etcd", torture_node_control=True),
    "etcd-node-cache": persistent_handle_setup("etcd", **_FAILOVER),
    # selftest's line only: their throwaway servers listen on 127.0.0.1,
    # which the nodes' namespaces do not reach (etcd's listens on the bridge)
    **{f"{adapter}-node-cache-node-address": persistent_handle_setup(adapter, torture_node_control=True)
       for adapter in ("rados", "cassandra")},
}

#: the suites (smbtorture's names, checked with --list on 4.25.1) and the subtests each must pass
SUITES = {
    "smb2.persistent-open-failover": ("failover-reconnect",),
    "smb2.persistent-open-reconnect-contended.reconnect-contended-failover": ("reconnect-contended-failover",),
}
#: seconds for one suite: six stops and continues, each a recovery and a takeover
SUITE_TIMEOUT = 900
_TIME = re.compile(r"^time: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)Z?$")
_EVENT = re.compile(r"^(test|success|failure|error|skip|xfail|uxsuccess): (.+?)(?: \[.*)?$")


@dataclass
class TortureRun:
    suite: str
    returncode: int
    output: str
    seconds: float
    results: dict[str, str] = field(default_factory=dict)
    #: subtest -> seconds between its "test:" and its result (subunit's time: lines)
    times: dict[str, float] = field(default_factory=dict)


def subtest_times(output: str) -> dict[str, float]:
    """Each subtest's duration from smbtorture's subunit time: lines."""
    now: datetime | None = None
    started: dict[str, datetime] = {}
    took: dict[str, float] = {}
    for line in output.splitlines():
        if match := _TIME.match(line):
            now = datetime.fromisoformat(match.group(1))
        elif (match := _EVENT.match(line)) and now is not None:
            kind, name = match.group(1), match.group(2).strip()
            if kind == "test":
                started[name] = now
            elif name in started:
                took[name] = (now - started.pop(name)).total_seconds()
    return took


def run_torture(cluster: SambaCluster, suite: str) -> TortureRun:
    """smbtorture at the public address; without one, over the nodes'
    addresses as Samba's selftest does (--unclist: each connection goes to
    the next node in the list, so a reconnect reaches another node)."""
    if cluster.network is not None:
        command = ["smbtorture", cluster.public_unc, "-U", f"{TEST_USER}%{TEST_PASSWORD}",
                   "--format=subunit", suite]
    else:
        unclist = write_unclist(cluster.sambas, cluster.root / "unclist")
        command = unclist_command(cluster.sambas, unclist, suite)
    start = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=SUITE_TIMEOUT,
                                cwd=cluster.root)
        returncode, output = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = -1
        output = f"{exc.stdout or ''}\ntimed out after {SUITE_TIMEOUT} s"
    run = TortureRun(suite, returncode, output, time.monotonic() - start)
    run.results = parse_results(output)
    run.times = subtest_times(output)
    return run


def _result(run: TortureRun, subtest: str) -> tuple[str, str]:
    """The subtest's result and its full subunit name (smbtorture may prefix it)."""
    for name, result in run.results.items():
        if name == subtest or name.endswith("." + subtest):
            return result, name
    return "missing", subtest


def _all_nodes_serving(cluster: SambaCluster, timeout: float = 120.0) -> None:
    """Every node OK again (a suite that failed half-way may leave its node
    stopped: it is continued here, and the test has failed already)."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = cluster.ctdb.nodes[0].ctdb("status", check=False)
        states = node_states(status)
        stopped = [pnn for pnn, state in states.items() if "STOPPED" in state]
        for pnn in stopped:
            cluster.ctdb.nodes[0].ctdb("-n", str(pnn), "continue", check=False)
        if states and all(state == "OK" for state in states.values()) and (
                cluster.network is None or cluster.ctdb.public_address_holder() is not None):
            return
        time.sleep(1)
    pytest.fail(f"the cluster is not back to three serving nodes:\n{status}")


@pytest.fixture(scope="module", params=list(CONFIGURATIONS))
def failover_cluster(request: pytest.FixtureRequest) -> Iterator[SambaCluster]:
    if os.geteuid() != 0:
        pytest.skip("smbd, ctdbd and network namespaces need root")
    with SambaCluster(CONFIGURATIONS[request.param]) as running:
        found = " ".join(running.processes().values())
        assert "ctdbd" in found and "smbd" in found, f"the cluster's processes are not found: {found}"
        network = running.network
        yield running
        processes = running.processes()
    left = still_running(processes)
    assert not left, f"the cluster's processes outlived its stop(): {left}"
    if network is not None:
        assert not network.leftovers(), f"the cluster's network outlived its stop(): {network.leftovers()}"


#: known to fail with a public address, measured on 4.25.1 (ctdb and etcd
#: alike): the subtest continues the stopped node (torture_start_ctdb_node)
#: through its first connection, which went to the public address on the
#: node it stops; the address's release resets that connection
#: (util.c:1134: NT_STATUS_CONNECTION_RESET). It passes only where the
#: address stays with the stopped node. Samba's selftest skips the suite
#: in its cluster (selftest/skip).
CONTENDED_RESET = ("the subtest's first connection, to the public address on the node it stops, is reset "
                   "when the address moves, and the node is continued through it")
CONTENDED = "smb2.persistent-open-reconnect-contended.reconnect-contended-failover"
#: how that failure reads; any other failure fails the test
_RESET_SIGNS = ("torture_ctdb_start_node failed",
                "status was NT_STATUS_CONNECTION_RESET, expected NT_STATUS_OK: torture_smb2_testdir failed")


@pytest.mark.parametrize("suite", list(SUITES))
def test_smbtorture_failover_suite(failover_cluster: SambaCluster, suite: str) -> None:
    cluster = failover_cluster
    _all_nodes_serving(cluster)
    before = cluster.ctdb.public_address_holder() if cluster.network is not None else None
    logs = [node.base / "node-control.log" for node in cluster.ctdb.nodes]
    positions = [log.stat().st_size if log.exists() else 0 for log in logs]
    run = run_torture(cluster, suite)
    control = "".join(log.read_bytes()[position:].decode(errors="replace")
                      for log, position in zip(logs, positions) if log.exists())
    where = f"public address on node {before}" if cluster.network is not None else "the nodes' addresses"
    print(f"\n{suite}: {run.seconds:.1f} s, exit {run.returncode}; {where} before")
    for subtest in SUITES[suite]:
        result, name = _result(run, subtest)
        print(f"  {name}: {result}" + (f" in {run.times[name]:.1f} s" if name in run.times else ""))
    print("  node control:\n" + "\n".join(f"    {line}" for line in control.splitlines()[-24:]))
    if suite == CONTENDED and cluster.network is not None:
        result, name = _result(run, "reconnect-contended-failover")
        assert result != "success", f"{name} passed with a public address: CONTENDED_RESET is out of date"
        if all(sign in run.output for sign in _RESET_SIGNS):
            pytest.xfail(CONTENDED_RESET)
    for subtest in SUITES[suite]:
        result, name = _result(run, subtest)
        assert result == "success", (
            f"{suite}: {name}: {result} (smbtorture exit {run.returncode}); its output's end:\n"
            + "\n".join(run.output.splitlines()[-40:]))
    assert run.returncode == 0, f"smbtorture exited {run.returncode}:\n{run.output[-3000:]}"
    # each stop did stop its node through ctdb (not a subtest that passed
    # without a failover) and, with a public address, moved it to another node
    stops = _STOPPED.findall(control)
    assert stops, f"smbtorture stopped no node:\n{control}"
    assert all(rc == "0" for _, rc in stops), f"a ctdb stop failed:\n{control}"
    if cluster.network is not None:
        moved = _MOVED.findall(control)
        assert len(moved) == len(stops), f"a stop logged no public address:\n{control}"
        for pnn, holder in moved:
            assert holder != pnn, f"the public address stayed on node {pnn}, which smbtorture stopped"
    _all_nodes_serving(cluster)


#: the stop script's lines: "<time> stop_node <pnn>: ctdb stop exit <rc>", and
#: with a public address "<time> stop_node <pnn>: public address: Public IPs ... <ip> <holder>"
_STOPPED = re.compile(r"stop_node (\d+): ctdb stop exit (\d+)")
_MOVED = re.compile(r"stop_node (\d+): public address: .*?\d+\.\d+\.\d+\.\d+ (-?\d+)")
