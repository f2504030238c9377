"""A backend's throwaway server listens where a networked cluster's nodes
reach it (``throwaway_host``: the bridge address SambaCluster passes when
its nodes sit in namespaces of their own, samba_cluster.py), over TCP, so
that the network profile's delay is on the way: a process in a node's
namespace, behind the TCP relay of a profile of tens of milliseconds,
stores and reads a record through the adapter with the options the server
gave, and the read takes at least the profile's round trip.

The broken examples: a server on 127.0.0.1 cannot be reached from the
node's namespace (it has a loopback of its own), and one reached by a
unix socket (the file system is shared) is reached with no delay."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dbwrap_py.cluster import tcp_delay
from dbwrap_py.cluster.netem import PROFILES, TCP_DELAY
from dbwrap_py.servers import ServerError
from dbwrap_py.testing.hooks import hooks_for

pytestmark = pytest.mark.server

RELAY_MISSING = tcp_delay.tcp_delay_missing() if os.geteuid() == 0 else "network namespaces need root"
needs_relay = pytest.mark.skipif(bool(RELAY_MISSING), reason=f"no tcp delay relay here: {RELAY_MISSING}")

#: the adapters SambaCluster runs with a throwaway server, and the options
#: bench cluster gives them (fdb: its model; no FoundationDB can run here)
ADAPTERS = {"etcd": {}, "rados": {}, "zookeeper": {}, "cassandra": {}, "fdb": {"fdb_library": "model"}}

#: the delay: tens of milliseconds, far above a read on one host
PROFILE = PROFILES["wan"]

#: run in the node's namespace: open the database, store and read a record;
#: prints the value read and how long the read took (ms)
ROUND_TRIP = """
import json, sys, tempfile, time
from dbwrap_py.adapter import DatabaseSpec
from dbwrap_py.options import Options
from dbwrap_py.registry import find_adapter
name, options = sys.argv[1], json.loads(sys.argv[2])
options.setdefault("op_timeout", "20")
with tempfile.TemporaryDirectory() as folder:
    db = find_adapter(name)(DatabaseSpec(folder + "/probe.tdb"), Options(options))
    try:
        db.lock(b"k")
        db.put(b"k", b"from the node's namespace")
        db.unlock(b"k")
        began = time.perf_counter()
        value = db.get(b"k")
        print(json.dumps([value.decode(), (time.perf_counter() - began) * 1000]))
    finally:
        db.close()
"""


def round_trip_from(member, name: str, options: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*member.exec_prefix(), sys.executable, "-c", ROUND_TRIP, name, json.dumps(options)],
                          capture_output=True, text=True, timeout=180)


def server_for(name: str, host: str | None):
    options = dict(ADAPTERS[name])
    if host is not None:
        options["throwaway_host"] = host
    try:
        server = hooks_for(name).throwaway_server(options)
    except ServerError as exc:
        pytest.skip(f"no {name} server here: {exc}")
    assert server is not None, f"{name} gave no throwaway server"
    return server


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@needs_relay
@pytest.mark.parametrize("name", list(ADAPTERS))
def test_a_node_behind_the_relay_reaches_the_server_at_the_bridge_address(name):
    from dbwrap_py.cluster.netns import NetnsNetwork

    with NetnsNetwork(nodes=1, profile=PROFILE, method=TCP_DELAY) as network:
        with server_for(name, network.bridge_address) as reach:
            done = round_trip_from(network.members[0], name, {**ADAPTERS[name], **reach})
            relays = [relay.process.pid for relay in network.relays]
    assert done.returncode == 0, f"{name} from the node's namespace: {done.stderr[-2000:]}"
    value, read_ms = json.loads(done.stdout)
    assert value == "from the node's namespace"
    assert read_ms >= PROFILE.least_round_trip_ms, (
        f"{name}: a read from the node's namespace took {read_ms:.2f} ms, under the "
        f"{PROFILE.least_round_trip_ms:g} ms round trip of {PROFILE.name}: not through the relay")
    assert network.leftovers() == [] and not any(os.path.exists(f"/proc/{pid}") for pid in relays)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@needs_relay
def test_a_server_on_loopback_is_out_of_a_nodes_reach_the_broken_example():
    from dbwrap_py.cluster.netns import NetnsNetwork

    with NetnsNetwork(nodes=1, profile=PROFILE, method=TCP_DELAY) as network:
        with server_for("etcd", None) as reach:
            assert "127.0.0.1" in json.dumps(reach)
            done = round_trip_from(network.members[0], "etcd", {**reach, "op_timeout": "3"})
    assert done.returncode != 0, "a server on the caller's loopback was reached from a node's namespace"
