"""The cluster's own rules that need no running cluster: reading ctdb
status, choosing the nodes' addresses, refusing a half configuration, and
finding a cluster's processes. (tests/cluster runs real clusters.)"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from dbwrap_py.adapter import DatabaseSpec
from dbwrap_py.cluster.ctdb import CTDB_PORT, free_addresses, node_states
from dbwrap_py.cluster.processes import cpu_seconds, in_sessions, session_leading_children, still_running
from dbwrap_py.cluster.samba_cluster import ClusterError, ClusterSetup, SambaCluster
from dbwrap_py.database import named_by_file
from dbwrap_py.errors import ConfigError
from dbwrap_py.options import Options
from dbwrap_py.servers import stop_process_group

STATUS = """Number of nodes:3
pnn:0 127.0.0.1        OK (THIS NODE)
pnn:1 127.0.0.2        DISCONNECTED|UNHEALTHY|INACTIVE
pnn:2 127.0.0.3        OK
Generation:1431253112
Size:2
Recovery mode:NORMAL (0)
"""


def test_node_states_reads_each_pnn():
    assert node_states(STATUS) == {0: "OK", 1: "DISCONNECTED|UNHEALTHY|INACTIVE", 2: "OK"}


def test_addresses_move_on_while_ctdbs_port_is_taken():
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", CTDB_PORT))
        except OSError:
            pass  # taken already (a ctdbd, or TIME_WAIT): the same outcome is wanted
        addresses = free_addresses(3)
    assert "127.0.0.1" not in addresses
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.") for a in addresses)


def test_an_adapter_without_databases_is_refused():
    with pytest.raises(ClusterError):
        SambaCluster(ClusterSetup(adapter="etcd"))
    with pytest.raises(ClusterError):
        SambaCluster(ClusterSetup(databases=("locking.tdb",)))


def test_cluster_name_file_names_a_database_by_its_file_alone():
    a = DatabaseSpec("/node0/lock/locking.tdb")
    b = DatabaseSpec("/node1/lock/locking.tdb")
    assert a.cluster_name != b.cluster_name and a.cluster_name.startswith("locking.tdb@")
    by_file = [DatabaseSpec(s.name, named_by_file=True) for s in (a, b)]
    assert by_file[0].cluster_name == by_file[1].cluster_name == "locking.tdb"
    assert named_by_file(Options({"cluster_name": "file"})) and not named_by_file(Options({}))
    with pytest.raises(ConfigError):
        named_by_file(Options({"cluster_name": "host"}))


def _until(condition, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def test_a_servers_session_is_found_whole_and_seen_gone_by_pid():
    """What SambaCluster.processes and kill_node rely on: a server started in
    a session of its own, and what it forked, are found by the session, and
    are seen gone after a SIGKILL to the group (the orphan too, once reaped)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 61 & exec sleep 62"], start_new_session=True)
    try:
        # both named: the forked child is "sh -c ..." until it has exec'd sleep 61
        expected = ["sleep 61", "sleep 62"]
        def both() -> dict[int, str]:
            found = in_sessions({leader.pid})
            return found if sorted(found.values()) == expected else {}

        members = _until(both)
        assert members and sorted(members.values()) == expected, in_sessions({leader.pid})
        assert leader.pid in session_leading_children()
        assert still_running(members) == members
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        assert _until(lambda: not still_running(members)), still_running(members)
    finally:
        stop_process_group(leader, signal.SIGKILL)


def test_cpu_seconds_count_a_session_by_command_with_the_children_it_reaped():
    """What bench cluster's "cpu ms" per open reads: a session's CPU time by
    command name, a reaped child's counted in its parent's."""
    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.3: pass')"
    script = f"{sys.executable} -c \"{burn}\"; exec sleep 63"  # a child burns, is reaped, then sleep
    leader = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        assert _until(lambda: "sleep" in cpu_seconds({leader.pid})), in_sessions({leader.pid})
        used = cpu_seconds({leader.pid})
        assert list(used) == ["sleep"], used
        assert used["sleep"] >= 0.3, f"the reaped child's 0.3 s counts in its parent's: {used}"
        assert cpu_seconds({leader.pid + 1_000_000}) == {}, "another session counts nothing"
    finally:
        stop_process_group(leader, signal.SIGKILL)


def test_a_reused_pid_is_not_the_process_that_had_it():
    me = in_sessions({os.getsid(0)})[os.getpid()]
    assert still_running({os.getpid(): me}) == {os.getpid(): me}
    assert still_running({os.getpid(): "ctdbd -i"}) == {}


IP_OUTPUT = """Public IPs on node 0
10.254.7.100 1
10.254.7.101 -1
"""


def test_the_public_address_holder_is_read_from_ctdb_ip():
    from dbwrap_py.cluster.ctdb import _IP_LINE

    assert _IP_LINE.findall(IP_OUTPUT) == [("10.254.7.100", "1"), ("10.254.7.101", "-1")]


def test_node_control_stops_in_the_background_only_with_a_public_address(tmp_path):
    from dbwrap_py.cluster.ctdb import CtdbNode
    from dbwrap_py.cluster.netns import NodeNetwork

    cluster = SambaCluster(ClusterSetup(torture_node_control=True), root=tmp_path)
    for network, background in ((None, False), (NodeNetwork(0, "ns", "veth", "10.254.7.1"), True)):
        base = tmp_path / str(background)
        base.mkdir()
        params = cluster._node_control(CtdbNode(0, base, "10.254.7.1", network))
        assert params["smbd:FSCTL_SMBTORTURE"] == "yes" and params["smbd:suicide mode"] == "yes"
        stop = (base / "stop_node.sh").read_text()
        start = (base / "start_node.sh").read_text()
        assert params["clusteredmember:stop_node"] == str(base / "stop_node.sh")
        assert 'ctdb -n "$1" stop' in stop and 'ctdb -n "$1" continue' in start
        assert stop.rstrip().endswith("exit 0") == background  # the FSCTL's answer first
        assert ("public address" in stop) == background
        assert " &\n" not in start
        for script in (base / "stop_node.sh", base / "start_node.sh"):
            assert os.access(script, os.X_OK)
            assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_the_network_is_made_and_removed_whole():
    from dbwrap_py.cluster.netns import NODE_INTERFACE, NetnsNetwork

    with NetnsNetwork(nodes=2) as network:
        assert sorted(network.leftovers()) == sorted(
            [f"netns {network.tag}n0", f"netns {network.tag}n1", f"link {network.bridge}",
             f"link {network.tag}v0", f"link {network.tag}v1"])
        inside = subprocess.run([*network.members[1].exec_prefix(), "ip", "-4", "-o", "addr", "show",
                                 NODE_INTERFACE], capture_output=True, text=True, check=True).stdout
        assert f" {network.members[1].address}/24 " in inside
        # a node reaches the caller's namespace across the bridge
        with socket.socket() as listener:
            listener.bind((network.bridge_address, 0))
            listener.listen(1)
            port = listener.getsockname()[1]
            connect = f"import socket; socket.create_connection(({network.bridge_address!r}, {port}), 5).close()"
            subprocess.run([*network.members[0].exec_prefix(), sys.executable, "-c", connect],
                           check=True, timeout=30)
            peer = listener.accept()[0]
            assert peer.getpeername()[0] == network.members[0].address
            peer.close()
    assert network.leftovers() == []
