"""A network of its own for a cluster's nodes, so that ctdb can move a
public address between them (IP takeover): one network namespace per
node, each joined by a veth pair to a bridge in the caller's namespace.

    host namespace                      node namespace <tag>n<pnn>
    bridge  <tag>br  10.254.X.254/24 --- veth <tag>v<pnn> == pub0  10.254.X.<pnn+1>/24
                                                               (+ the public address while
                                                                ctdb gives it to this node)

The node addresses (ctdb's nodes file) sit on each namespace's ``pub0``,
so ctdbds talk across the bridge; ctdb's 10.interface event script adds
the public address to ``pub0`` of the node that hosts it and removes it
when the node releases it. The caller's namespace reaches every node and
the public address through the bridge, so a client (smbtorture) runs
where it is. Unix sockets (ctdbd's, smbd's messaging) are files, and work
across namespaces as they did before.

Everything is made with ``ip`` (iproute2) and removed by name at stop():
the namespaces, the veths (a veth pair goes with either end) and the
bridge. /run/netns (the folder and the mount ``ip netns add`` makes of it)
stays, as ip leaves it: another network of this host may be making its
namespaces there at that moment (two test processes side by side did:
the one that unmounted it made the other's ``ip netns exec`` fail).
Processes run inside a namespace with ``ip netns exec``, which execs the
command: the PID the caller gets is the process's own.

With a network profile (netem.py), by netem every node's ``pub0`` and the
bridge delay what they send: what a node sends to another node or to the
caller's namespace (the backend's server, smbtorture) leaves by its
``pub0``, what the caller's namespace sends to a node leaves by the
bridge. The qdiscs go with their devices at stop(). Without netem, a TCP
delay relay in each node's namespace (tcp_delay.py) delays the TCP
connections the node makes to the other nodes and to the bridge address;
stop() ends the relays by PID, and their nft tables go with the namespaces.
A profile with far nodes (netem.py) is made by the relays only: a far
node's relay holds every connection it makes by the far delay, and every
other node's holds its connections to a far node's address so, its others
by the profile's own delay.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.cluster.netem import NETEM, TCP_DELAY, NetworkProfile, delay_egress, delay_method
from dbwrap_py.cluster.tcp_delay import Hold, TcpDelayRelay
from dbwrap_py.servers import StartStop

IP = "ip"
NETNS_DIR = Path("/run/netns")
#: the interface each node namespace has, holding its node address and, while
#: its node hosts it, the public address (ctdb's public_addresses names it)
NODE_INTERFACE = "pub0"
#: the host part of the bridge's address and of the public address
BRIDGE_HOST, PUBLIC_HOST = 254, 100


class NetnsError(RuntimeError):
    """A namespace, veth or bridge could not be made."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _used_subnets() -> set[str]:
    """The /24s of every IPv4 address in this namespace ("10.254.7")."""
    out = _ip("-4", "-o", "addr", "show").stdout
    return {word.split("/")[0].rsplit(".", 1)[0] for line in out.splitlines()
            for word in line.split()[3:4]}


@dataclass
class NodeNetwork:
    """One node's namespace and its address."""

    pnn: int
    namespace: str
    veth: str  # the host end, on the bridge
    address: str

    def exec_prefix(self) -> list[str]:
        """What runs a command inside this node's namespace (it execs it)."""
        return [IP, "netns", "exec", self.namespace]


@dataclass
class NetnsNetwork(StartStop):
    """``nodes`` namespaces on a bridge, a /24 of 10.254.0.0/16 unused here."""

    nodes: int = 3
    #: names start with it (interface names are at most 15 characters)
    tag: str = field(default_factory=lambda: f"dbw{os.getpid() % 0x10000:04x}")
    subnet: str = ""
    #: how far apart the nodes and the caller's namespace are; None: no delay
    profile: NetworkProfile | None = None
    #: how the profile's delay is made (netem.py's NETEM, TCP_DELAY, NO_DELAY);
    #: "": start() chooses with delay_method
    method: str = ""
    #: where the TCP delay relays write their errors (tcp-delay-<namespace>.log); None: stderr
    log_dir: Path | None = None
    relays: list[TcpDelayRelay] = field(default_factory=list)
    members: list[NodeNetwork] = field(default_factory=list)
    _made: list[tuple[str, str]] = field(default_factory=list)  # ("netns" | "link", name), in order

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def bridge_address(self) -> str:
        """The caller's address on the bridge, which every node reaches."""
        return f"{self.subnet}.{BRIDGE_HOST}"

    @property
    def public_address(self) -> str:
        return f"{self.subnet}.{PUBLIC_HOST}"

    @property
    def prefix_length(self) -> int:
        return 24

    @property
    def addresses(self) -> list[str]:
        return [member.address for member in self.members]

    def start(self) -> None:
        if not 1 <= self.nodes <= 99:
            raise NetnsError(f"{self.nodes} nodes: 1 to 99 fit this network's addresses")
        used = _used_subnets()
        free = [f"10.254.{n}" for n in range(1, 254) if f"10.254.{n}" not in used]
        if not free:
            raise NetnsError("every /24 of 10.254.0.0/16 is in use here")
        # one spread by the tag, so that two networks at once rarely try the same
        self.subnet = free[int(self.tag[-4:], 16) % len(free)]
        self._make()  # part-made, it is removed by stop() (StartStop)

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.bridge_address}/{self.prefix_length}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for pnn in range(self.nodes):
            member = NodeNetwork(pnn, f"{self.tag}n{pnn}", f"{self.tag}v{pnn}", f"{self.subnet}.{pnn + 1}")
            _ip("netns", "add", member.namespace)
            self._made.append(("netns", member.namespace))
            _ip("link", "add", member.veth, "type", "veth", "peer", "name", NODE_INTERFACE,
                "netns", member.namespace)
            self._made.append(("link", member.veth))
            _ip("link", "set", member.veth, "master", self.bridge, "up")
            inside = ["netns", "exec", member.namespace, IP]
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "addr", "add", f"{member.address}/{self.prefix_length}", "dev", NODE_INTERFACE)
            _ip(*inside, "link", "set", NODE_INTERFACE, "up")
            self.members.append(member)
        if self.profile is not None:
            self._delay(self.profile)

    def _delay(self, profile: NetworkProfile) -> None:
        self.method = self.method or delay_method(profile)
        if self.method == NETEM:
            for prefix, device in self.senders():
                delay_egress(prefix, device, profile)
        elif self.method == TCP_DELAY:
            far_hold = Hold(profile.far_delay_ms, profile.far_jitter_ms)
            for member in self.members:
                if member.pnn in profile.far_nodes:  # far from every other site
                    self.start_relay(member, far_hold, far_hold)
                    continue
                hold = Hold(profile.delay_ms, profile.jitter_ms)
                far = [m.address for m in self.members if m.pnn in profile.far_nodes]
                self.start_relay(member, hold, hold, far=far, far_hold=far_hold)

    def start_relay(self, member: NodeNetwork, sends: Hold, replies: Hold, far: Sequence[str] = (),
                    far_hold: Hold = Hold(0.0)) -> TcpDelayRelay:
        """A TCP delay relay in ``member``'s namespace for its connections to
        the other nodes and the bridge address, those to ``far`` held by
        ``far_hold`` both ways; stopped by stop()."""
        others = [m.address for m in self.members if m is not member]
        log = self.log_dir / f"tcp-delay-{member.namespace}.log" if self.log_dir is not None else None
        relay = TcpDelayRelay(member.exec_prefix(), member.namespace, [*others, self.bridge_address],
                              sends, replies, log, far=tuple(far), far_hold=far_hold)
        self.relays.append(relay)
        relay.start()
        return relay

    def senders(self) -> list[tuple[list[str], str]]:
        """Each site's sending device, with what runs tc in its namespace:
        every node's ``pub0``, and the bridge for the caller's namespace."""
        return [(member.exec_prefix(), NODE_INTERFACE) for member in self.members] + [([], self.bridge)]

    def stop(self) -> None:
        """Remove what start() made, newest first; raise when any of it is
        still there afterwards (a namespace some process still holds)."""
        errors = []
        for relay in self.relays:
            relay.stop()
        for kind, name in reversed(self._made):
            if kind == "netns":
                result = _ip("netns", "del", name, check=False)
            else:
                if not Path(f"/sys/class/net/{name}").exists():
                    continue  # a veth pair goes with its namespace's end
                result = _ip("link", "del", name, check=False)
            if result.returncode != 0:
                errors.append(f"{kind} {name}: {result.stderr.strip()}")
        self._made.clear()
        self.members.clear()
        left = self.leftovers()
        if errors or left:
            raise NetnsError(f"the network was not removed: {errors} {left}")

    def leftovers(self) -> list[str]:
        """This network's namespaces and interfaces still present."""
        left = []
        if NETNS_DIR.is_dir():
            left += [f"netns {p.name}" for p in NETNS_DIR.iterdir() if p.name.startswith(self.tag)]
        left += [f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(self.tag)]
        left += [f"tcp delay relay {r.namespace} (pid {r.process.pid})" for r in self.relays
                 if r.running() and r.process is not None]
        return left
