"""Network profiles: how far apart a cluster's nodes are, and how that
delay is made here (``delay_method``): by tc netem, which delays every
packet a site sends (``tc qdisc ... netem delay``), when the kernel has
it, else by a relay in each node's namespace that delays the node's own
TCP connections (tcp_delay.py).

A site is a node's namespace, or the caller's namespace, where the
backend's throwaway server and smbtorture run (netns.py says which device
each one sends on). Every site delays what it sends by the profile's
one-way delay, so any two sites are that far apart one way and a round
trip between them pays it twice: node to node (ctdb), node to the backend
(smbd and the node agents), and smbtorture to smbd alike. The relay
(``tcp-delay``) delays both directions of every TCP connection a node
makes to another node or to the caller's namespace, so those round trips
pay it twice too; connections the caller's namespace makes (smbtorture to
smbd) are not delayed, as if the clients sat next to their node.

The values are assumptions of typical round trips, not measurements:

* ``lan``: 0.2 ms one way, 0.05 ms jitter: hosts in one data centre or
  cloud zone, where round trips of 0.1 to 0.5 ms are usual.
* ``region``: 1 ms one way, 0.2 ms jitter: nodes in different zones of
  one cloud region; providers describe zones as a few milliseconds or
  less apart round trip (Azure: under 2 ms).
* ``wan``: 30 ms one way, 2 ms jitter: nodes in different regions of one
  continent, some tens of milliseconds apart round trip.
* ``multi-region``: 0.1 ms one way, 0.02 ms jitter, between every two
  sites, except that node 2 (PNN 2) is 15 ms one way, 1 ms jitter, from
  every other site: nodes 0 and 1 and the caller's namespace (the
  backend's server) in one zone, node 2 in another region of the
  continent (issue 41).
* ``local``: no delay: the namespaces and bridge alone, the baseline the
  others are measured against.

A profile with far nodes (``far_nodes``, ``far_delay_ms``) is not
uniform as the others are: a site is ``far_delay_ms`` from a far node,
``delay_ms`` from the rest (``one_way``). That is a delay per
destination, which only the relay makes (it knows each connection's
destination); netem would need tc filters per destination, which nothing
here sets, so ``delay_method`` chooses the relay for such a profile even
where netem exists, and refuses the profile where the relay cannot run.
With the relay, connections from the caller's namespace to a far node
(smbtorture to its smbd) are not delayed either.

netem keeps packets in the order they are due, so a jitter larger than the
gap between two packets reorders them; the jitters above are a quarter of
the delay or less.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

TC = "tc"
#: what delays packets: tc netem, else the TCP relay; none for no delay
NETEM, TCP_DELAY, NO_DELAY = "netem", "tcp-delay", "none"


class NetemError(RuntimeError):
    """A profile is unknown, or its delay could not be set."""


@dataclass(frozen=True)
class NetworkProfile:
    """The one-way delay between any two sites, and its jitter (ms); with
    ``far_nodes``, those nodes (PNNs) are ``far_delay_ms`` one way
    (``far_jitter_ms`` jitter) from every other site instead."""

    name: str
    delay_ms: float
    jitter_ms: float = 0.0
    about: str = ""
    far_nodes: frozenset[int] = frozenset()
    far_delay_ms: float = 0.0
    far_jitter_ms: float = 0.0

    @property
    def round_trip_ms(self) -> float:
        """What a round trip between two sites (neither a far node) pays on average."""
        return 2 * self.delay_ms

    @property
    def least_round_trip_ms(self) -> float:
        """The shortest round trip between two sites (neither a far node)
        netem allows: each way at least the delay less the jitter."""
        return 2 * max(self.delay_ms - self.jitter_ms, 0.0)

    def one_way(self, site: int | None, other: int | None) -> tuple[float, float]:
        """(delay, jitter) in ms one way between two sites: node PNNs, None
        for the caller's namespace. Far when either is a far node."""
        if site != other and (site in self.far_nodes or other in self.far_nodes):
            return self.far_delay_ms, self.far_jitter_ms
        return self.delay_ms, self.jitter_ms

    def least_round_trip_between_ms(self, site: int | None, other: int | None) -> float:
        """The shortest round trip between two sites (as for ``one_way``):
        each way at least its delay less its jitter."""
        delay, jitter = self.one_way(site, other)
        return 2 * max(delay - jitter, 0.0)

    @property
    def delays(self) -> bool:
        """Whether any two sites are apart by more than nothing."""
        return self.delay_ms > 0 or (bool(self.far_nodes) and self.far_delay_ms > 0)

    def describe(self) -> str:
        """The delays in words: "0.1 ms one way; node 2 15 ms from every other site"."""
        text = f"{self.delay_ms:g} ms one way"
        if self.far_nodes:
            nodes = ", ".join(map(str, sorted(self.far_nodes)))
            text += f"; node{'s' if len(self.far_nodes) > 1 else ''} {nodes} {self.far_delay_ms:g} ms " \
                    "from every other site"
        return text

    def netem_args(self) -> list[str]:
        """tc's qdisc arguments for the delay between any two sites; none
        for no delay. A profile with far nodes has no such one delay
        (delay_egress refuses it)."""
        if self.delay_ms <= 0:
            return []
        jitter = [f"{self.jitter_ms:g}ms"] if self.jitter_ms > 0 else []
        return ["netem", "delay", f"{self.delay_ms:g}ms", *jitter]


PROFILES: dict[str, NetworkProfile] = {p.name: p for p in (
    NetworkProfile("local", 0.0, 0.0, "no delay: the namespaces and bridge alone"),
    NetworkProfile("lan", 0.1, 0.02, "one data centre or cloud zone"),
    NetworkProfile("region", 1.0, 0.2, "zones of one cloud region"),
    NetworkProfile("wan", 30.0, 2.0, "regions of one continent"),
    NetworkProfile("multi-region", 0.1, 0.02, "one zone, but node 2 in another region (issue 41)",
                   far_nodes=frozenset({2}), far_delay_ms=15.0, far_jitter_ms=1.0),
)}


def profile_named(name: str) -> NetworkProfile:
    """The profile called ``name``; an unknown name is refused with the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(f"{p.name} ({p.describe()}: {p.about})" for p in PROFILES.values())
        raise NetemError(f"unknown network profile {name!r}; known profiles: {known}") from None


#: why a profile with far nodes needs the relay
_FAR_NEEDS_RELAY = ("its far nodes are further from every other site than the rest, a delay per "
                    "destination, which only the tcp delay relay makes here (netem would need tc "
                    "filters per destination, which are not written)")


def delay_egress(exec_prefix: Sequence[str], device: str, profile: NetworkProfile) -> None:
    """Delay every packet ``device`` sends by ``profile``; ``exec_prefix``
    runs tc in the device's namespace (empty: the caller's). The qdisc goes
    with the device. A profile with far nodes is refused: its delay depends
    on the destination, which one qdisc does not tell apart."""
    if profile.far_nodes:
        raise NetemError(f"network profile {profile.name}: {_FAR_NEEDS_RELAY}")
    args = profile.netem_args()
    if not args:
        return
    command = [*exec_prefix, TC, "qdisc", "add", "dev", device, "root", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetemError(f"network profile {profile.name}: {' '.join(command)} failed "
                         f"({result.returncode}): {result.stderr.strip()}{_missing_hint(result.stderr)}")


def _missing_hint(stderr: str) -> str:
    if "unknown" in stderr.lower() and "qdisc" in stderr.lower():
        return " (this kernel has no netem: sch_netem, CONFIG_NET_SCH_NETEM)"
    return ""


def netem_missing() -> str:
    """Why netem cannot delay packets here, or '' when it can: a delay is set
    on the loopback of a network namespace made for it (``unshare -n``),
    which goes with the command. The kernel loads sch_netem when tc asks
    for it, if it is a module."""
    command = ["unshare", "-n", TC, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        return f"{exc.filename} is not installed (tc is in iproute2, unshare in util-linux)"
    if result.returncode == 0:
        return ""
    return f"{' '.join(command)} failed: {result.stderr.strip()}{_missing_hint(result.stderr)}"


def delay_method(profile: NetworkProfile) -> str:
    """How ``profile``'s delay is made here: ``NETEM`` when the kernel has
    it, else ``TCP_DELAY`` when nft can redirect to the relay; ``NO_DELAY``
    for a profile without one. A profile with far nodes takes the relay
    even where netem exists. Refused, saying why, when none of these works."""
    if not profile.delays:
        return NO_DELAY
    from dbwrap_py.cluster.tcp_delay import tcp_delay_missing

    if profile.far_nodes:
        no_relay = tcp_delay_missing()
        if not no_relay:
            return TCP_DELAY
        raise NetemError(f"network profile {profile.name}: {_FAR_NEEDS_RELAY}; tcp delay: {no_relay}")
    no_netem = netem_missing()
    if not no_netem:
        return NETEM
    no_relay = tcp_delay_missing()
    if not no_relay:
        return TCP_DELAY
    raise NetemError(f"network profile {profile.name}: nothing can delay packets here: "
                     f"netem: {no_netem}; tcp delay: {no_relay}")
