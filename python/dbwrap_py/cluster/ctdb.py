"""A throwaway ctdb: one ctdbd per node on 127.0.0.1, .2, .3 ..., all state
in one folder; or, with a NetnsNetwork, each ctdbd in a network namespace
of its own, with a public address that ctdb moves between the nodes.

With ``CTDB_TEST_MODE=yes`` ctdbd takes every path from ``CTDB_BASE``: its
ctdb.conf, nodes file, socket, pid file and database directories. So the
nodes share nothing with the machine's /etc/ctdb, and nothing else does
with them. Each ctdbd runs in the foreground (``-i``, logging to its
stderr file) as the leader of its own process group, so stopping a node by
its ctdbd's PID ends its helpers (eventd, lock helpers) with it.

    with CtdbCluster(Path(tmp), nodes=3) as ctdb:
        ctdb.nodes[0].ctdb("getdbmap")
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.cluster.netns import NODE_INTERFACE, NetnsNetwork, NodeNetwork
from dbwrap_py.servers import StartStop, stop_process_group

CTDBD = "/usr/sbin/ctdbd"
CTDB = "ctdb"
#: ctdb's helpers (eventd, lock and recovery helpers) as Debian installs
#: them. From 4.25 ctdbd in test mode takes their folder only from
#: CTDB_TEST_HELPER_BINDIR, and aborts without it; 4.17 ignores it.
HELPER_BINDIR = "/usr/libexec/ctdb"
#: ctdb's shipped notification script; without it ctdbd logs a line per state change
NOTIFY_SCRIPT = Path("/etc/ctdb/notify.sh")
#: ctdb's shell functions, which its event scripts read from CTDB_BASE
FUNCTIONS = Path("/etc/ctdb/functions")
#: the event script that adds a public address to the node taking it over
#: and removes it from the node releasing it (``ip addr``; its iptables
#: rules are skipped, with a logged error, where iptables is not installed)
INTERFACE_SCRIPT = Path("/usr/share/ctdb/events/legacy/10.interface.script")

#: ctdbd in test mode skips two things it does with a public address
#: (ctdbd.c: do_checkpublicip = false; ctdb_takeover.c): it does not look
#: whether its node has the address already, so every takeover run asks the
#: holder to take it again, 10.interface's ``ip addr add`` fails with
#: "Address already assigned" and the node is banned; and it announces no
#: taken address (no gratuitous ARP), so clients keep sending to the old
#: node's MAC address until their neighbour entry goes stale (smbtorture's
#: reconnect: NT_STATUS_IO_TIMEOUT). Both measured on 4.25.1. This wrapper
#: does what ctdbd does outside test mode: a takeip of an address the
#: interface has is done, and a taken address is announced (``ctdb
#: gratarp``, as 10.interface's own updateip does); ctdb's script does the rest.
TAKEIP_ONCE = """#!/bin/sh
# ctdb's 10.interface; a takeip of an address the interface has already is
# done, and a taken address is announced (ctdbd in test mode does neither)
if [ "$1" = takeip ]; then
\tif ip -o addr show dev "$2" | grep -qF " $3/$4 "; then
\t\techo "takeip: $3/$4 is on $2 already"
\t\texit 0
\tfi
\t{script} "$@" || exit $?
\texec ctdb gratarp "$3" "$2"
fi
exec {script} "$@"
"""

_STATUS_LINE = re.compile(r"^pnn:(\d+)\s+(\S+)\s+(\S+)", re.MULTILINE)
#: ``ctdb ip``'s lines: "10.254.7.100 1" (-1: nobody hosts it)
_IP_LINE = re.compile(r"^(\d+\.\d+\.\d+\.\d+)\s+(-?\d+)\s*$", re.MULTILINE)


class CtdbError(RuntimeError):
    """ctdbd would not start or become healthy, or a ctdb command failed."""


#: ctdbd's TCP port (4.17 takes it from /etc/services, else this)
CTDB_PORT = 4379


def free_addresses(nodes: int) -> list[str]:
    """Loopback addresses for ``nodes`` ctdbds: 127.0.0.1, .2, .3 unless a
    cluster stopped in the last minute left connections of port 4379 in
    TIME_WAIT there (ctdbd binds without SO_REUSEADDR, so it could not
    listen); then .11, .12, .13, and so on. All of 127/8 is lo's."""
    for first in range(1, 255 - nodes, 10):
        addresses = [f"127.0.0.{first + pnn}" for pnn in range(nodes)]
        if all(_bindable(address, CTDB_PORT) for address in addresses):
            return addresses
    raise CtdbError(f"port {CTDB_PORT} is busy on every group of {nodes} loopback addresses")


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


@dataclass
class CtdbNode:
    """One ctdbd: its folder (its CTDB_BASE) and its process."""

    pnn: int
    base: Path
    address: str
    #: the node's network namespace; None: the caller's (loopback addresses)
    network: NodeNetwork | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def socket(self) -> Path:
        """What smbd's ``ctdbd socket`` names."""
        return self.base / "run" / "ctdbd.socket"

    @property
    def log(self) -> Path:
        return self.base / "ctdbd.log"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CTDB_TEST_MODE": "yes", "CTDB_BASE": str(self.base),
                "CTDB_TEST_HELPER_BINDIR": HELPER_BINDIR,
                # the event scripts' state (their my-pnn cache, iptables' lock):
                # the node's own, not /var/lib/ctdb/scripts shared by every node
                "CTDB_SCRIPT_VARDIR": str(self.base / "scripts")}

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def write_config(self, nodes: str, cluster_lock: Path, public_addresses: Sequence[str] = ()) -> None:
        """``public_addresses`` ("10.254.7.100/24"): on NODE_INTERFACE, moved
        by ctdb; none: no IP takeover, failover is off."""
        for sub in ("run", "var", "scripts", "events/legacy", "db/volatile", "db/persistent", "db/state"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "nodes").write_text(nodes)
        (self.base / "public_addresses").write_text(
            "".join(f"{address} {NODE_INTERFACE}\n" for address in public_addresses))
        if NOTIFY_SCRIPT.exists():
            shutil.copy(NOTIFY_SCRIPT, self.base / "notify.sh")
        if public_addresses:  # ctdb's 10.interface, enabled, behind TAKEIP_ONCE
            (self.base / "functions").symlink_to(FUNCTIONS)
            script = self.base / "events" / "legacy" / INTERFACE_SCRIPT.name
            script.write_text(TAKEIP_ONCE.format(script=INTERFACE_SCRIPT))
            script.chmod(0o755)
        db = self.base / "db"
        (self.base / "ctdb.conf").write_text(
            "[logging]\n\tlog level = NOTICE\n"
            f"[cluster]\n\tnode address = {self.address}\n\tcluster lock = {cluster_lock}\n"
            f"[database]\n\tvolatile database directory = {db}/volatile\n"
            f"\tpersistent database directory = {db}/persistent\n"
            f"\tstate database directory = {db}/state\n"
            f"[failover]\n\tdisabled = {'false' if public_addresses else 'true'}\n"
            "[legacy]\n\trealtime scheduling = false\n")

    def start(self) -> None:
        with open(self.log, "ab") as log:
            where = self.network.exec_prefix() if self.network is not None else []
            self.process = subprocess.Popen([*where, CTDBD, "-i"], env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, start_new_session=True)

    def stop(self, sig: int = signal.SIGTERM, wait: float = 10.0) -> None:
        """End ctdbd and its helpers by ctdbd's PID (its process group);
        SIGKILL after ``wait`` seconds, or at once when ``sig`` is SIGKILL."""
        if self.process is not None:
            stop_process_group(self.process, sig, wait)
            self.process = None

    def ctdb(self, *args: str, timeout: float = 30.0, check: bool = True) -> str:
        """A ctdb command through this node's ctdbd; its output."""
        result = subprocess.run([CTDB, *args], env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise CtdbError(f"ctdb {' '.join(args)} on node {self.pnn} failed ({result.returncode}): "
                            f"{result.stdout}{result.stderr}\n{self.log_tail()}")
        return result.stdout

    def log_tail(self, lines: int = 20) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def node_states(status: str) -> dict[int, str]:
    """``ctdb status``'s per-node states: {pnn: "OK" | "DISCONNECTED|..."}."""
    return {int(pnn): state for pnn, _, state in _STATUS_LINE.findall(status)}


class CtdbCluster(StartStop):
    """``nodes`` ctdbds under ``root``, healthy when start() returns."""

    def __init__(self, root: Path, nodes: int = 3, start_timeout: float = 90.0,
                 network: NetnsNetwork | None = None, spare: int = 0) -> None:
        """``network``: started, with a namespace per node (``nodes`` +
        ``spare``); its public address is ctdb's to move (IP takeover).
        ``spare``: that many more nodes in every node's nodes file, not
        started (ctdb sees them DISCONNECTED) until join() starts one: a
        node added to a running cluster, as ctdb adds one that was listed."""
        if not 1 <= nodes + spare <= 254 or spare < 0:
            raise CtdbError(f"{nodes} nodes and {spare} spare: 1 to 254 fit on 127.0.0.0/8 here")
        self.root = root
        self.start_timeout = start_timeout
        self.size = nodes
        self.spare = spare
        self.network = network
        self.nodes: list[CtdbNode] = []

    def start(self) -> None:
        public: list[str] = []
        if self.network is not None:
            addresses = self.network.addresses
            public = [f"{self.network.public_address}/{self.network.prefix_length}"]
            self.nodes = [CtdbNode(pnn, self.root / f"ctdb{pnn}", address, self.network.members[pnn])
                          for pnn, address in enumerate(addresses)]
        else:
            addresses = free_addresses(self.size + self.spare)
            self.nodes = [CtdbNode(pnn, self.root / f"ctdb{pnn}", address) for pnn, address in enumerate(addresses)]
        nodes = "".join(f"{address}\n" for address in addresses)
        for node in self.nodes:
            node.write_config(nodes, self.root / "cluster.lock", public)
        for node in self.nodes[:self.size]:
            node.start()
        self.wait_healthy()

    def join(self, pnn: int, timeout: float | None = None) -> None:
        """A spare node joins: its ctdbd starts, and this returns once every
        running node sees it OK and the recovery its arrival starts is done."""
        node = self.nodes[pnn]
        if pnn < self.size or node.process is not None:
            raise CtdbError(f"node {pnn} is not a spare node that never ran")
        node.start()
        self.wait_healthy(timeout)

    def stop(self) -> None:
        for node in self.alive():  # all at once: each takes seconds to wind down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGTERM)  # type: ignore[union-attr]
        for node in self.nodes:
            node.stop()

    def alive(self) -> list[CtdbNode]:
        return [node for node in self.nodes if node.running()]

    def public_address_holder(self) -> int | None:
        """The PNN ctdb has given the public address to; None: nobody (yet)."""
        assert self.network is not None
        out = self.alive()[0].ctdb("ip", timeout=15, check=False)
        for address, pnn in _IP_LINE.findall(out):
            if address == self.network.public_address:
                return int(pnn) if int(pnn) >= 0 else None
        return None

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Until every running node reports every running node OK, and
        recovery is done (about 10 s from a cold start here); with a
        network, until a node hosts the public address too."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last = ""
        while time.monotonic() < deadline:
            alive = self.alive()
            if len(alive) < sum(node.process is not None for node in self.nodes):
                dead = [n for n in self.nodes if n.process is not None and not n.running()]
                raise CtdbError(f"ctdbd of node {dead[0].pnn} exited:\n{dead[0].log_tail()}")
            want = {node.pnn for node in alive}
            try:
                last = alive[0].ctdb("status", timeout=15, check=False)
            except subprocess.TimeoutExpired:
                last = "ctdb status timed out (ctdbd busy with recovery)"
                continue
            states = node_states(last)
            if ({pnn for pnn, state in states.items() if state.startswith("OK")} >= want
                    and "Recovery mode:NORMAL" in last):
                if self.network is None:
                    return
                holder = self.public_address_holder()
                if holder is not None:
                    return
                last += f"\nnobody hosts {self.network.public_address} yet"
            time.sleep(0.5)
        raise CtdbError(f"ctdb not healthy after {timeout or self.start_timeout:g} s:\n{last}\n"
                        + "\n".join(f"node {n.pnn}: {n.log_tail(8)}" for n in self.nodes))
