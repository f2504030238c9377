"""The cross-node checks, each a function of a running SambaCluster that
raises AssertionError when the nodes do not see each other's state. The
tests run them on good configurations, where they must pass, and on a
broken one (every node's locking databases its own), where each must fail.

Two clients on different nodes act on one file of the shared folder. The
throwaway smbd has kernel share modes and posix locking off, so the only
thing that can make them see each other is the cluster's databases:
locking.tdb for share modes and oplocks, brlock.tdb for byte-range locks.
"""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractContextManager

from dbwrap_py.cluster.samba_cluster import LOCKING_DATABASES, SambaCluster
from dbwrap_py.testing.smb_client import (OPLOCK_II, READ, SHARE_ALL, SHARE_READ, WRITE, BreakWatch, SmbClient, smb_client,
                        status_of)


NT_STATUS_SHARING_VIOLATION = 0xC0000043
NT_STATUS_LOCK_NOT_GRANTED = 0xC0000055  # smbprotocol names only the first


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}.txt"


def _client(cluster: SambaCluster, pnn: int) -> AbstractContextManager[SmbClient]:
    return smb_client(cluster.sambas[pnn].setup.address, cluster.port)


def share_mode_conflict(cluster: SambaCluster, holder: int = 0, others: tuple[int, ...] = (1, 2)) -> None:
    """A deny-write open on node 1 (or the node of pnn ``holder``) makes opens
    for write on the others fail."""
    name = _name("share-mode")
    with _client(cluster, holder) as one:
        held = one.open(name, WRITE, SHARE_READ)
        for pnn in others:
            with _client(cluster, pnn) as other:
                status = status_of(lambda: other.open(name, WRITE, SHARE_ALL))
            assert status == NT_STATUS_SHARING_VIOLATION, (
                f"node {pnn + 1} opened for write a file node {holder + 1} holds deny-write (0x{status:08x})")
        held.close()
        with _client(cluster, others[0]) as other:
            other.open(name, WRITE, SHARE_ALL).close()  # free once the holder closed it


def byte_range_conflict(cluster: SambaCluster, holder: int = 0, other: int = 1) -> None:
    """A byte-range lock on node 1 blocks a conflicting one on node 2 (or on
    the nodes of pnn ``holder`` and ``other``)."""
    name = _name("brlock")
    with _client(cluster, holder) as one, _client(cluster, other) as two:
        mine, theirs = one.open(name, WRITE, SHARE_ALL), two.open(name, WRITE, SHARE_ALL)
        one.lock(mine, 0, 100)
        status = status_of(lambda: two.lock(theirs, 50, 100))
        assert status == NT_STATUS_LOCK_NOT_GRANTED, (
            f"node {other + 1} locked bytes 50-149 while node {holder + 1} holds 0-99 (0x{status:08x})")
        one.lock(mine, 0, 100, unlock=True)
        two.lock(theirs, 50, 100)  # free once the holder unlocked
        mine.close()
        theirs.close()


def oplock_break(cluster: SambaCluster, wait: float = 10.0) -> None:
    """A level II oplock held on node 1 is broken by a write on node 2."""
    name = _name("oplock")
    first = cluster.sambas[0].setup.address
    with BreakWatch(first, cluster.port) as watch, smb_client("127.0.0.1", watch.port) as one, \
            _client(cluster, 1) as two:
        held = one.open(name, READ, SHARE_ALL, oplock=OPLOCK_II)
        assert held.oplock_level == OPLOCK_II, f"node 1 granted oplock level {held.oplock_level}, not II"
        writer = two.open(name, WRITE, SHARE_ALL)
        writer.write(b"node 2 was here", 0)
        deadline = time.monotonic() + wait
        while watch.breaks == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.breaks > 0, f"node 1's client got no oplock break within {wait:g} s of node 2's write"
        writer.close()
        held.close()


def opens_listed_everywhere(cluster: SambaCluster) -> None:
    """``smbstatus -L`` on every node lists an open held on node 1."""
    name = _name("listed")
    with _client(cluster, 0) as one:
        held = one.open(name, READ, SHARE_ALL)
        for samba in cluster.sambas:
            out = samba.run_tool(["smbstatus", "-L", "-s", str(samba.conf)]).stdout
            assert name in out, (
                f"smbstatus -L on {samba.setup.address} does not list node 1's open of {name}:\n{out}")
        held.close()


CHECKS = [share_mode_conflict, byte_range_conflict, oplock_break, opens_listed_everywhere]
#: how each check fails when the nodes do not see each other
BLIND = {share_mode_conflict: "opened for write a file", byte_range_conflict: "locked bytes 50-149",
         oplock_break: "got no oplock break", opens_listed_everywhere: "does not list node 1's open"}


def sticky_databases(cluster, pnn: int) -> set[str]:
    """The locking databases node ``pnn``'s ctdbd keeps sticky (each
    attached first: smbd attaches them only when it uses them)."""
    node = cluster.ctdb.nodes[pnn]
    sticky = set()
    for name in LOCKING_DATABASES:
        node.ctdb("attach", name)
        if "STICKY: yes" in node.ctdb("getdbstatus", name):
            sticky.add(name)
    return sticky
