"""A throwaway Samba cluster on one host: per node one ctdbd and one smbd
with ``clustering = yes``, on 127.0.0.1, .2, .3, serving one shared folder.

ctdb carries the messaging in every configuration (cross-node wake-ups of
dbwrap_watch and g_lock travel as ctdb messages, as in a real cluster), and
the persistent databases (passdb, secrets: one test user for every node).
The volatile databases come from one of three places:

* ctdb itself, the baseline (``ClusterSetup()``);
* an adapter through the bridge for the databases named in ``databases``
  (``LOCKING_DATABASES``: share modes, byte-range locks, leases) or all
  eight (``samba.VOLATILE_DATABASES``); with ``node_cache``, every node has
  a node agent of its own;
* a plain tdb on each node, for those in ``node_local`` (``ctdb:<db> = no``):
  smbXsrv_open_global as in the seed talks, or, as a broken configuration
  the cross-node checks must catch, locking.tdb.

With ``public_address``, each node's ctdbd and smbd run in a network
namespace of their own (netns.py) and ctdb moves a public address between
the nodes; so do the node agents, which reach the backend's server across
the bridge as smbd does. smbd listens on port 445 of every address of its
namespace, so the node that hosts the public address serves it. With
``network``, a profile (netem.py) also delays what each node and the
caller's namespace (the backend's server, smbtorture) send, by netem; or,
where the kernel has no netem, the TCP connections each node makes, by a
relay in its namespace (tcp_delay.py; its errors in the cluster's folder,
tcp-delay-<namespace>.log).
``torture_node_control`` adds what smbtorture's failover suites drive the cluster with (below).

Everything is stopped by PID: smbd and ctdbd by their process groups, the
node agents and the backend's throwaway server by their own; the network,
the namespaces, veths and bridge, is removed after them.

    with SambaCluster(ClusterSetup(adapter="etcd", databases=LOCKING_DATABASES)) as cluster:
        cluster.sambas[1].unc   # //127.0.0.2/test
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.cluster.ctdb import CtdbCluster, CtdbNode
from dbwrap_py.cluster.netem import NetemError, profile_named
from dbwrap_py.cluster.netns import NODE_INTERFACE, NetnsNetwork
from dbwrap_py.cluster.processes import cpu_seconds, in_sessions, session_leading_children
from dbwrap_py.cluster.replicas import BackendReplicas
from dbwrap_py.nodecache.adapter import node_cache_mode
from dbwrap_py.options import Options
from dbwrap_py.registry import find_adapter
from dbwrap_py.samba import SHARE, TEST_USER, SambaSetup, ThrowawaySamba
from dbwrap_py.servers import StartStop
from dbwrap_py.smbtorture import PERSISTENT_GLOBAL
from dbwrap_py.testing.hooks import hooks_for

#: the databases of share modes, byte-range locks and leases
LOCKING_DATABASES = ("locking.tdb", "brlock.tdb", "leases.tdb")
#: what a persistent handle needs kept through its node's death (Samba 4.25
#: opens them per-record persistent; leases.tdb is not, and a continuously
#: available share grants at most an R lease, which a reclaim takes again)
PERSISTENT_HANDLE_DATABASES = ("smbXsrv_open_global.tdb", "locking.tdb", "brlock.tdb")
#: the share's parameters with persistent handles: a cluster is scale-out
#: by Samba's default, so only continuous availability is added
CONTINUOUSLY_AVAILABLE = {"continuous availability": "yes"}
#: smbd's port in a node's own namespace: the one a client of the public address expects
SMB_PORT = 445
#: the node control scripts smbd runs (source3/smbd/smb2_ioctl_smbtorture.c:
#: smbrun of "<script> <pnn>", as the connected user, whose exit status
#: becomes the FSCTL's), each through its own node's ctdbd
NODE_CONTROL = {"stop_node": "stop", "start_node": "continue"}


class ClusterError(RuntimeError):
    """The cluster would not come up."""


@dataclass
class ClusterSetup:
    """What the cluster runs with; the default is ctdb for everything."""

    nodes: int = 3
    #: the adapter for ``databases``; None: ctdb keeps every volatile database
    adapter: str | None = None
    databases: Sequence[str] = ()
    #: the adapter's options (its endpoints when a server is already up; node_cache)
    adapter_options: Mapping[str, str] = field(default_factory=dict)
    #: databases each node keeps in a plain tdb of its own (ctdb:<db> = no)
    node_local: Sequence[str] = ()
    #: with node_cache, the node agents' lease (seconds; their --ttl): how long
    #: a dead node's records stay its own. None: the agent's default
    node_lease_ttl: float | None = None
    extra_global: Mapping[str, str] = field(default_factory=dict)
    #: SMB3 persistent handles (Samba 4.25): ``persistent handles = yes`` and
    #: the test share continuously available, on every node
    persistent_handles: bool = False
    #: the backend's servers: several replicas (replicas.py) instead of the
    #: adapter's one-replica throwaway server, so that a test can lose one
    #: with a node (lose_replica). None: the throwaway server
    replicas: Callable[[], BackendReplicas] | None = None
    #: every node in a network namespace of its own, and a public address
    #: that ctdb moves to another node when its node stops (IP takeover)
    public_address: bool = False
    #: a network profile's name (netem.py: lan, region, wan, multi-region, local): the
    #: nodes in namespaces of their own as with ``public_address``, each
    #: site's packets delayed by the profile. None: no delay
    network: str | None = None
    #: smbtorture's node control (its failover suites): smbd's torture
    #: FSCTLs, of which STOP/START_CTDB_NODE run ``ctdb stop``/``ctdb
    #: continue`` on the node they name, and its suicide packet
    torture_node_control: bool = False
    #: with node_cache, the node agents serve Prometheus metrics (on a free
    #: port of their node's address each; agent_counters sums them): the benchmarks' view
    agent_metrics: bool = False
    log_level: int = 1
    #: that many more nodes (PNNs from ``nodes`` on), in ctdb's nodes file
    #: but not started until join_node(): nodes added to the running cluster
    spare_nodes: int = 0
    #: volatile databases ctdb keeps with sticky records (``ctdb setdbsticky``
    #: on every node, as that control reaches only the node it is sent to): a
    #: record migrated to a node often (HopcountMakeSticky, default 50 hops)
    #: stays there StickyPindown ms (default 200) before it moves again.
    #: Off in ctdb by default; the reference as an operator would tune it
    ctdb_sticky: Sequence[str] = ()


#: seconds a node agent has for its first lease: a backend of three replicas
#: just started (three Cassandra nodes agreeing on the schema the agent
#: makes, beside everything else on 2 cores) took more than 15
AGENT_START_TIMEOUT = 60.0
#: seconds: the persistent-handle configurations' leases (the adapter's record
#: locks, the node agents' --ttl): a dead node's records are free in seconds
PERSISTENT_LEASE = 2


def persistent_handle_setup(adapter: str | None = None, node_cache: str = "yes",
                            lock_lease: float = PERSISTENT_LEASE, **more) -> ClusterSetup:
    """Samba 4.25's persistent handles on the cluster: ctdb keeping every
    database (``adapter`` None: ctdb pushes each persistent record to every
    node), or the persistent-handle databases on ``adapter`` through the
    node cache (``node_cache``: "yes", write-back, which writes persistent
    records through; "write-through"; "" for none), with short leases: the
    node agents' PERSISTENT_LEASE, and ``lock_lease`` for the adapter's
    record and transaction locks (a holder stalled past it is fenced out).
    ``more``: the rest of ClusterSetup (replicas, public_address, ...)."""
    if adapter is None:
        return ClusterSetup(persistent_handles=True, **more)
    lease_option = "lease_ttl" if adapter == "etcd" else "lease"  # etcd's name for its record locks' lease
    options = {lease_option: f"{lock_lease:g}", **({"node_cache": node_cache} if node_cache else {})}
    return ClusterSetup(adapter=adapter, databases=PERSISTENT_HANDLE_DATABASES, adapter_options=options,
                        node_lease_ttl=PERSISTENT_LEASE if node_cache else None, persistent_handles=True, **more)


def free_port_on_every_node(addresses: Sequence[str]) -> int:
    """A TCP port free on every node's address (smbtorture's --unclist takes one -p)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
        except OSError:
            continue
        return port
    raise ClusterError("no port free on every node's address")


class SambaCluster(StartStop):
    """The cluster of ``setup``, up when start() returns."""

    def __init__(self, setup: ClusterSetup | None = None, root: Path | None = None) -> None:
        self.setup = setup or ClusterSetup()
        if (self.setup.adapter is None) != (not self.setup.databases):
            raise ClusterError("name an adapter and the databases it keeps, or neither")
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="dbwrap_py_cluster."))
        self.share_path = self.root / SHARE
        self.network = self._network()
        self.ctdb = CtdbCluster(self.root, self.setup.nodes, network=self.network, spare=self.setup.spare_nodes)
        self.sambas: list[ThrowawaySamba] = []
        self.agents: list[object] = []  # NodeAgentProcess per node, with node_cache
        self.daemons: list[object] = []  # ProxyDaemonProcess per node, with transport=proxy
        self.backend_options: dict[str, str] = {}
        #: the backend's replicas, with ClusterSetup.replicas
        self.replicas: BackendReplicas | None = None
        self._stack = contextlib.ExitStack()
        #: the sessions of every server start() began (see processes.py)
        self._sessions: set[int] = set()
        self._port = 0  # smbd's, on every node
        #: with node_cache, the options a node agent gets (a joining node's too)
        self._agent_options: dict[str, str] | None = None

    @property
    def uncs(self) -> list[str]:
        return [samba.unc for samba in self.sambas]

    @property
    def port(self) -> int:
        return self.sambas[0].port

    @property
    def public_unc(self) -> str:
        """The share at the public address (``public_address``)."""
        if self.network is None:
            raise ClusterError("this cluster has no public address (ClusterSetup.public_address)")
        return f"//{self.network.public_address}/{SHARE}"

    def start(self) -> None:
        before = session_leading_children()
        try:
            self._start()
        finally:  # a start that failed part-way is stopped, and checked, too
            self._sessions |= session_leading_children() - before

    def _start(self) -> None:
        elsewhere = set(self.setup.ctdb_sticky) & {*self.setup.databases, *self.setup.node_local}
        if elsewhere:
            raise ClusterError(f"ctdb_sticky: ctdb does not keep {', '.join(sorted(elsewhere))} in this setup")
        self.root.chmod(0o755)  # the test user must reach the share inside
        self.share_path.mkdir(mode=0o777, exist_ok=True)
        self.share_path.chmod(0o777)
        if self.network is not None:
            self._stack.enter_context(self.network)  # closed last, after every process
        self._stack.enter_context(self.ctdb)
        if self.setup.adapter is not None:
            self.backend_options = self._stack.enter_context(self._backend())
        if self.network is not None:
            self._port = SMB_PORT
        else:  # the spare nodes' addresses too: they take the same port when they join
            self._port = free_port_on_every_node([node.address for node in self.ctdb.nodes])
        for node in self.ctdb.nodes[:self.setup.nodes]:
            self._start_samba(node)
        self._make_sticky(self.ctdb.nodes[:self.setup.nodes])

    def _make_sticky(self, nodes: Sequence[CtdbNode]) -> None:
        """``ctdb_sticky``'s databases: attached (cluster-wide, if smbd has
        not yet), then sticky on each of ``nodes``."""
        for name in self.setup.ctdb_sticky:
            nodes[0].ctdb("attach", name)
            for node in nodes:
                node.ctdb("setdbsticky", name)
                status = node.ctdb("getdbstatus", name)
                if "STICKY: yes" not in status:
                    raise ClusterError(f"ctdb setdbsticky {name} on node {node.pnn}: getdbstatus does "
                                       f"not show it sticky:\n{status}")

    def _start_samba(self, node: CtdbNode) -> None:
        samba = ThrowawaySamba(self._samba_setup(node, self._port), root=self.root / f"smb{node.pnn}")
        self.sambas.append(samba)
        samba.start()

    def join_node(self, pnn: int) -> None:
        """Spare node ``pnn`` (ClusterSetup.spare_nodes; the next one in PNN
        order) joins the running cluster: its ctdbd, once every node sees it
        OK and ctdb's recovery is done; then its node agent and node daemon
        (with node_cache and transport=proxy) and its smbd."""
        if pnn != len(self.sambas) or pnn >= len(self.ctdb.nodes):
            raise ClusterError(f"node {pnn} cannot join: the next spare node is {len(self.sambas)}"
                               f" of {len(self.ctdb.nodes)} nodes")
        before = session_leading_children()
        try:
            node = self.ctdb.nodes[pnn]
            self.ctdb.join(pnn)
            self._make_sticky([node])
            if self._agent_options is not None:
                self._start_agent(node, self._stack)
            if self.daemons:
                self._start_daemon(node, self._stack)
            self._start_samba(node)
        finally:
            self._sessions |= session_leading_children() - before

    def stop(self) -> None:
        """smbd first (it needs ctdbd to wind down), then the node agents,
        the backend's server and ctdbd (the reverse of their start); then
        the folder."""
        for samba in self.sambas:
            samba.stop()
        self._stack.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def processes(self) -> dict[int, str]:
        """Every live process of the cluster (PID: command line): its servers
        and whatever they forked; nothing once stop() returned."""
        return in_sessions(self._sessions)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds the cluster's processes used so far, by command name
        (processes.cpu_seconds): smbd, ctdbd, the agents, the backend's server."""
        return cpu_seconds(self._sessions)

    def agent_counters(self) -> dict[str, float]:
        """The node agents' metrics summed over the nodes, by name without
        the dbwrap_py_node_agent_ prefix ({} without ClusterSetup.agent_metrics)."""
        from dbwrap_py.metrics import scrape

        total: dict[str, float] = {}
        if not self.setup.agent_metrics:
            return total
        for agent in self.agents:
            for name, value in scrape(agent.metrics_url()).items():  # type: ignore[attr-defined]
                short = name.removeprefix("dbwrap_py_node_agent_")
                total[short] = total.get(short, 0.0) + value
        return total

    def node_processes(self, pnn: int) -> dict[int, str]:
        """The live processes of one node: its smbd, ctdbd and node agent,
        and whatever they forked."""
        return in_sessions(self._node_leaders(pnn))

    def kill_node(self, pnn: int) -> dict[int, str]:
        """A node's crash: SIGKILL to its smbd, its ctdbd and its node agent,
        each with whatever it forked, all at once (one after another, the
        node would die over seconds: a killed process group takes a second
        or two to be gone here). Returns the processes the node had, for a
        caller to see them gone (processes.still_running)."""
        had = self.node_processes(pnn)
        for leader in self._node_leaders(pnn):  # each leads its process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
        self.sambas[pnn].kill()  # each waits until its group is gone, and reaps
        self.ctdb.nodes[pnn].stop(signal.SIGKILL)
        if self.agents:
            self.agents[pnn].stop(signal.SIGKILL)  # type: ignore[attr-defined]
        return had

    def leave_node(self, pnn: int) -> None:
        """A node leaves cleanly, in ctdb's order: ``ctdb stop`` (ctdb
        recovers the databases without it), then its smbd, its node daemon,
        its node agent (SIGTERM: it hands every record back first) and its
        ctdbd, each stopped by PID."""
        self.ctdb.nodes[pnn].ctdb("stop", timeout=60)
        self.sambas[pnn].stop()
        if self.daemons:
            self.daemons[pnn].stop()  # type: ignore[attr-defined]
        if self.agents:
            self.agents[pnn].stop()  # type: ignore[attr-defined]
        self.ctdb.nodes[pnn].stop()

    def backend_report(self) -> str:
        """What the backend holds now and its server's log ends (etcd warns
        there of a slow disk or apply), for a failed test to print."""
        if self.setup.adapter is None:
            return "(ctdb: no backend of ours)"
        try:
            lines = hooks_for(self.setup.adapter).diagnose(self.backend_options)
        except Exception as exc:  # a report, never a second failure
            return f"(the backend could not be asked: {exc!r})"
        return "\n".join(lines) if lines else "(the backend's test hooks report nothing)"

    def lose_replica(self) -> None:
        """One of the backend's replicas crashes (SIGKILL by PID)."""
        if self.replicas is None:
            raise ClusterError("the backend runs one replica here (ClusterSetup.replicas)")
        self.replicas.lose_one()

    def _node_leaders(self, pnn: int) -> set[int]:
        ctdbd = self.ctdb.nodes[pnn].process
        agent = self.agents[pnn].pid if self.agents else None  # type: ignore[attr-defined]
        leaders = (self.sambas[pnn].pid, ctdbd.pid if ctdbd is not None else None, agent)
        return {pid for pid in leaders if pid is not None}

    # -- pieces ---------------------------------------------------------------

    def _network(self) -> NetnsNetwork | None:
        """The nodes' namespaces, with ``public_address`` or a ``network`` profile."""
        if self.setup.network is None:
            return NetnsNetwork(self.setup.nodes + self.setup.spare_nodes) if self.setup.public_address else None
        try:
            profile = profile_named(self.setup.network)
        except NetemError as exc:
            raise ClusterError(f"ClusterSetup.network: {exc}") from exc
        return NetnsNetwork(self.setup.nodes + self.setup.spare_nodes, profile=profile, log_dir=self.root)

    @contextlib.contextmanager
    def _backend(self) -> Iterator[dict[str, str]]:
        """The adapter's options with its throwaway server's endpoint (unless
        given), and with node_cache, a node agent per node."""
        adapter = self.setup.adapter
        assert adapter is not None
        cls = find_adapter(adapter)
        options = dict(self.setup.adapter_options)
        without_cache = {k: v for k, v in options.items() if k not in ("node_cache", "node_cache_dir")}
        with contextlib.ExitStack() as stack:
            if self.setup.replicas is not None and self.network is not None:
                raise ClusterError("replicas listen on 127.0.0.1, which the nodes' namespaces do not reach")
            if self.setup.replicas is not None:
                self.replicas = stack.enter_context(self.setup.replicas())
                reach = {**options, **self.replicas.options()}
            else:
                if self.network is not None:  # the nodes reach the caller's namespace only at the bridge
                    without_cache["throwaway_host"] = self.network.bridge_address
                server = hooks_for(adapter).throwaway_server(without_cache)
                reach = {**options, **(stack.enter_context(server) if server is not None else {})}
            if node_cache_mode(Options(dict(options))) is not None:
                self._agent_options = {k: v for k, v in reach.items() if k in cls.option_names}
                for node in self.ctdb.nodes[:self.setup.nodes]:
                    self._start_agent(node, stack)
            if reach.get("transport") == "proxy" and not reach.get("proxy_socket"):
                for node in self.ctdb.nodes[:self.setup.nodes]:
                    self._start_daemon(node, stack)
            yield reach

    def _start_agent(self, node: CtdbNode, stack: contextlib.ExitStack) -> None:
        """The node agent of ``node`` (with node_cache)."""
        from dbwrap_py.nodecache.agent import NodeAgentProcess  # only with the cache
        assert self.setup.adapter is not None and self._agent_options is not None
        agent = NodeAgentProcess(self.setup.adapter, self._agent_options, cache_dir=self.root / f"cache{node.pnn}",
                                 node=f"node{node.pnn}", ttl=self.setup.node_lease_ttl,
                                 start_timeout=AGENT_START_TIMEOUT,
                                 command_prefix=node.network.exec_prefix() if node.network else (),
                                 metrics_port=self._agent_metrics_port(node))
        self.agents.append(stack.enter_context(agent))

    def _start_daemon(self, node: CtdbNode, stack: contextlib.ExitStack) -> None:
        """With ``transport=proxy``, the node daemon of ``node`` (proxy mode:
        one store session per node, whatever the number of smbd processes),
        in the node's namespace, as its agent: it reaches the store from there."""
        from dbwrap_py.proxy.process import ProxyDaemonProcess  # its own threads: only when asked
        daemon = ProxyDaemonProcess(socket_path=self.root / f"proxy{node.pnn}.sock",
                                    command_prefix=node.network.exec_prefix() if node.network else ())
        self.daemons.append(stack.enter_context(daemon))

    def _agent_metrics_port(self, node: CtdbNode) -> str | None:
        """The agent's --metrics-port with ClusterSetup.agent_metrics: a free
        port on the node's address, which the caller's namespace reaches
        (127.0.0.x here; across the bridge from a node's namespace)."""
        return f"{node.address}:0" if self.setup.agent_metrics else None

    def _samba_setup(self, node: CtdbNode, port: int) -> SambaSetup:
        persistent = self.setup.persistent_handles
        extra = {
            "clustering": "yes",
            "ctdbd socket": str(node.socket),
            **{f"ctdb:{name}": "no" for name in self.setup.node_local},
            **(PERSISTENT_GLOBAL if persistent else {}),
            **self.setup.extra_global,
        }
        # the nodes' lock directories differ on one host, so databases are
        # named by file, as ctdb names them (the same path on every host would do)
        options = {"cluster_name": "file", **self.backend_options}
        if self.agents:
            options["node_cache_dir"] = str(self.agents[node.pnn].cache_dir)  # type: ignore[attr-defined]
        if self.daemons:
            options["proxy_socket"] = str(self.daemons[node.pnn].socket_path)  # type: ignore[attr-defined]
        share = dict(CONTINUOUSLY_AVAILABLE) if persistent else {}
        if node.network is not None:
            # every address of the namespace: the public one comes and goes
            extra = {**extra, "interfaces": NODE_INTERFACE, "bind interfaces only": "no"}
        if self.setup.torture_node_control:
            extra = {**extra, **self._node_control(node)}
            # smbd runs the node control scripts as the connected user; ctdbd's
            # socket is root's alone (0700), so the test user is root on the share
            share["admin users"] = TEST_USER
        return SambaSetup(
            bridged=tuple(self.setup.databases), adapter=self.setup.adapter or "tdb",
            adapter_options=options, extra_global=extra, log_level=self.setup.log_level,
            port=port, address=node.address, share_path=self.share_path,
            add_user=node.pnn == 0,  # passdb is a ctdb persistent database: every node sees it
            extra_share=share,
            command_prefix=node.network.exec_prefix() if node.network is not None else (),
        )

    def _node_control(self, node: CtdbNode) -> dict[str, str]:
        """smbd's parameters for smbtorture's node control, and the scripts
        they name, in the node's ctdb folder: ``ctdb -n <pnn> stop`` or
        ``continue`` through this node's ctdbd, logged to node-control.log
        beside it.

        With a public address the stop runs a second after the script has
        returned, in the background: a synchronous ``ctdb stop`` releases
        the public address (10.interface kills its TCP connections, smbd
        gets CTDB_SRVID_RELEASE_IP) before smbd can answer the FSCTL, and
        smbtorture fails with NT_STATUS_IO_TIMEOUT (measured on 4.25.1).
        Samba's own selftest has no public addresses (its clients connect
        to the nodes' private addresses), so its stop can be synchronous.
        The stop is logged with the node that hosts the public address after
        it, for the tests to see that the address moved."""
        params = {"smbd:FSCTL_SMBTORTURE": "yes", "smbd:suicide mode": "yes"}
        env = " ".join(f"{k}={v}" for k, v in node.env.items() if k.startswith("CTDB_"))
        log = node.base / "node-control.log"
        ctdb = f"env {env} ctdb"
        stamp = "$(date +%T.%N)"
        for option, command in NODE_CONTROL.items():
            run = (f'{ctdb} -n "$1" {command}; rc=$?\n'
                   f'echo "{stamp} {option} $1: ctdb {command} exit $rc"\n')
            if command == "stop" and node.network is not None:
                run += f'echo "{stamp} {option} $1: public address: $({ctdb} ip | tr "\\n" " ")"\n'
                body = f"(\nsleep 1\n{run}) < /dev/null >> {log} 2>&1 &\nexit 0\n"
            else:
                body = f"(\n{run}exit $rc\n) < /dev/null >> {log} 2>&1\n"
            script = node.base / f"{option}.sh"
            script.write_text(
                "#!/bin/sh\n"
                f"# clusteredmember:{option} of smbd on node {node.pnn}: ctdb {command} of node $1\n"
                "unset LD_PRELOAD\n"
                f'echo "{stamp} {option} $1" >> {log}\n' + body)
            script.chmod(0o755)
            params[f"clusteredmember:{option}"] = str(script)
        return params
