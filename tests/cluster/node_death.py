"""A node's death and the checks after it. ``node_one_dies`` has a client
on node 1 hold a file deny-write, a byte-range lock and a durable handle,
shows the survivors (nodes 2 and 3) are kept out, and SIGKILLs node 1's
smbd, ctdbd and node agent. Each check then raises AssertionError, with
the cause, when the survivors do not recover as they must.

What "free" means for the dead node's records, per configuration:

* ctdb: the records name node 1's server ids (vnn 0); smbd on a survivor
  asks its ctdbd whether such a process exists, which says no once ctdb has
  recovered without node 1, and drops the entries as stale.
* etcd: the same entries, read from etcd; any record lock the dead smbd
  held goes with its etcd lease (``lease_ttl``, plus etcd's 0.5 s lessor tick).
* etcd with the node cache: node 1's agent owned the records (their lock
  keys or buckets on its node lease, the agent's ``--ttl``); a survivor that
  wants one asks the dead agent, no answer comes, and it takes the record
  over once the node lease has lapsed. A write-back node loses what it had
  not written back; write-through kept every write in etcd.

So the records must be free within the lease of the configuration after
ctdb's recovery (smbd on a survivor waits for ctdb before anything) and
after the lease ran from the kill: ``max(kill + lease, recovered) + MARGIN``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smbprotocol.exceptions import SMBException

from cross_node import (NT_STATUS_SHARING_VIOLATION, NT_STATUS_LOCK_NOT_GRANTED, _client, _name,
                        byte_range_conflict, share_mode_conflict)
from dbwrap_py.cluster.ctdb import CtdbError, node_states
from dbwrap_py.cluster.processes import still_running
from dbwrap_py.cluster.samba_cluster import SambaCluster
from dbwrap_py.testing.smb_client import OPLOCK_BATCH, READ, SHARE_ALL, SHARE_READ, WRITE, SmbClient, status_of

#: seconds past the lease and ctdb's recovery a busy 2-core host may need
MARGIN = 6.0
#: ctdb's survivors notice a SIGKILLed node at once (its sockets close) and
#: recover in about 4 s here
RECOVERY_TIMEOUT = 60.0
SURVIVORS = (1, 2)  # pnn of nodes 2 and 3


@dataclass
class Crash:
    """A cluster whose node 1 died holding what the fields name."""

    cluster: SambaCluster
    #: seconds the configuration promises the dead node's records stay held
    lease: float
    killed_at: float  # time.monotonic()
    #: node 1's processes just before the kill (PID: command line)
    processes: dict[int, str]
    deny_write: str  # held open for write, sharing read only
    locked: str  # bytes 0-99 locked
    durable: str  # held with a durable handle and a batch oplock
    #: smbstatus's entry of the durable open, on node 1 before the kill
    durable_open: dict[str, Any]


def node_one_dies(cluster: SambaCluster, lease: float) -> Crash:
    """Node 1 dies holding what Crash names; ``lease``: what the cluster's
    configuration promises (see the module docstring)."""
    one = SmbClient(cluster.sambas[0].setup.address, cluster.port)
    deny_write, locked, durable = _name("deny-write"), _name("locked"), _name("durable")
    one.open(deny_write, WRITE, SHARE_READ)
    ranged = one.open(locked, WRITE, SHARE_ALL)
    one.lock(ranged, 0, 100)
    handle = one.open(durable, WRITE, SHARE_ALL, oplock=OPLOCK_BATCH, durable=True)
    assert handle.durable, f"node 1 granted no durable handle on {durable} (oplock {handle.oplock_level})"
    _survivors_kept_out(cluster, deny_write, locked)
    # With the node cache the survivors' tries moved both records to their
    # nodes; node 1 takes them back, so that they are its own when it dies
    # and only its lease frees them.
    one.open(deny_write, READ, SHARE_ALL)
    one.lock(ranged, 200, 10)
    durable_open = _only_open(cluster, 0, durable, fast=False)
    assert durable_open.get("oplock", {}).get("BATCH"), (
        f"node 1's durable open has no batch oplock: {durable_open}")
    killed_at = time.monotonic()  # kill_node signals first, then waits for the node to be gone
    processes = cluster.kill_node(0)
    one.abandon()
    return Crash(cluster, lease, killed_at, processes, deny_write, locked, durable, durable_open)


def _survivors_kept_out(cluster: SambaCluster, deny_write: str, locked: str) -> None:
    """Before the kill: what node 1 holds keeps nodes 2 and 3 out, so that
    their getting in later shows the records were freed."""
    for pnn in SURVIVORS:
        status = _try_open(cluster, pnn, deny_write)
        assert status == NT_STATUS_SHARING_VIOLATION, (
            f"node {pnn + 1} opened for write {deny_write}, which node 1 holds deny-write (0x{status:08x})")
        status = _try_lock(cluster, pnn, locked)
        assert status == NT_STATUS_LOCK_NOT_GRANTED, (
            f"node {pnn + 1} locked bytes 50-149 of {locked} while node 1 holds 0-99 (0x{status:08x})")


# -- the checks ---------------------------------------------------------------


def node_one_is_gone(crash: Crash) -> None:
    """Every process node 1 had (smbd and its children, ctdbd and its
    helpers, the node agent) is dead, by PID."""
    commands = " ".join(crash.processes.values())
    wanted = ["smbd", "ctdbd"] + (["nodecache.agent"] if crash.cluster.agents else [])
    assert all(name in commands for name in wanted), f"node 1 did not have {wanted}: {crash.processes}"
    left = still_running(crash.processes)
    assert not left, f"node 1's processes outlived the SIGKILL: {left}"


def survivors_recover(crash: Crash) -> float:
    """ctdb on nodes 2 and 3 shows both OK and recovery done, node 1 not
    OK, within RECOVERY_TIMEOUT; returns when it saw so."""
    ctdb = crash.cluster.ctdb
    try:
        ctdb.wait_healthy(RECOVERY_TIMEOUT)
    except CtdbError as exc:
        raise AssertionError(f"the survivors' ctdb did not recover from node 1's death: {exc}") from None
    status = ctdb.nodes[SURVIVORS[0]].ctdb("status", check=False)
    assert not node_states(status).get(0, "OK").startswith("OK"), f"ctdb counts dead node 1 OK:\n{status}"
    return time.monotonic()


def records_freed(crash: Crash) -> None:
    """Node 1's deny-write open and byte-range lock stop keeping nodes 2
    and 3 out within the lease (see the module docstring for when)."""
    deadline = _deadline(crash, survivors_recover(crash))
    tries: dict[tuple[int, str], Callable[[], int]] = {}
    for pnn in SURVIVORS:
        tries[(pnn, "open for write")] = lambda pnn=pnn: _try_open(crash.cluster, pnn, crash.deny_write)
        tries[(pnn, "lock bytes 50-149 of")] = lambda pnn=pnn: _try_lock(crash.cluster, pnn, crash.locked)
    last: dict[tuple[int, str], str] = {}
    while tries and time.monotonic() < deadline:
        for what, attempt in list(tries.items()):
            outcome = _outcome(attempt)
            if outcome == "ok":
                del tries[what]
            last[what] = outcome
            if time.monotonic() >= deadline:
                break
        time.sleep(0.2)
    assert not tries, (
        f"{_late(crash, deadline)} node 1's records still keep the survivors out: "
        + "; ".join(f"node {pnn + 1} cannot {what} {crash.deny_write if 'open' in what else crash.locked} "
                    f"({last.get((pnn, what), 'not tried')})" for pnn, what in tries)
        + "\n" + _ctdb_status(crash) + _survivors_logs(crash, {pnn for pnn, _ in tries}))


def _survivors_logs(crash: Crash, nodes: set[int]) -> str:
    """For a failure's message: the smbd log ends of ``nodes``, their node
    agents' logs, and what the backend holds (with its server's log)."""
    out = []
    for pnn in sorted(nodes):
        out.append(f"--- node {pnn + 1}'s smbd log ends ---\n{crash.cluster.sambas[pnn].log_tail(30)}")
        if crash.cluster.agents:
            log = crash.cluster.agents[pnn].log  # type: ignore[attr-defined]
            text = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else ["(no log)"]
            out.append(f"--- node {pnn + 1}'s node agent log ends ---\n" + "\n".join(text))
    out.append(f"--- the backend now ---\n{crash.cluster.backend_report()}")
    return "\n" + "\n".join(out)


def survivors_serve(crash: Crash) -> None:
    """After node 1's death nodes 2 and 3 serve new opens, reads, writes and
    byte-range locks, and still see each other's share modes and locks."""
    survivors_recover(crash)
    for pnn in SURVIVORS:
        data = f"node {pnn + 1} after node 1's death".encode()
        name = _name(f"after-{pnn + 1}")
        try:
            with _client(crash.cluster, pnn) as client:
                handle = client.open(name, WRITE, SHARE_ALL)
                handle.write(data, 0)
                read = handle.read(0, len(data))
                client.lock(handle, 0, 10)
                client.lock(handle, 0, 10, unlock=True)
                handle.close()
        except SMBException as exc:
            raise AssertionError(f"node {pnn + 1} failed on {name} after node 1's death: {exc}") from None
        assert read == data, f"node {pnn + 1} read back {read!r} from {name}, not {data!r}"
    share_mode_conflict(crash.cluster, holder=SURVIVORS[0], others=SURVIVORS[1:])
    byte_range_conflict(crash.cluster, holder=SURVIVORS[0], other=SURVIVORS[1])


def durable_record_kept(crash: Crash) -> None:
    """locking.tdb, read on node 2, still holds node 1's durable open: the
    same entry (server id of node 1's smbd process, share file id, batch
    oplock) node 1 listed before it died, within the lease.

    Read with ``smbstatus -L --json --fast`` on node 2: it reads locking.tdb
    through node 2's own bridge and node cache (what node 2's smbd would
    see), decodes Samba's record (a g_lock record around share_mode_data),
    and ``--fast`` keeps the entries of dead servers, which it otherwise
    drops after asking ctdb. A durable reconnect from another node is not
    tried: Samba 4.17 keeps a durable open reconnectable only once its smbd
    marked it disconnected, which a SIGKILLed smbd never does, and the
    smbXsrv_open_global records are node-local here (as in the seed talks).
    """
    deadline = _deadline(crash, survivors_recover(crash))
    while True:
        listed = _opens(crash.cluster, SURVIVORS[0], crash.durable, fast=True)
        if any(_same_open(entry, crash.durable_open) for entry in listed.values()):
            return
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{_late(crash, deadline)} locking.tdb on node 2 has no record of node 1's durable open of "
                f"{crash.durable} ({_open_id(crash.durable_open)}); it lists "
                f"{sorted(listed) or 'no open of that file'}")
        time.sleep(0.3)


# -- pieces ---------------------------------------------------------------------


def _try_open(cluster: SambaCluster, pnn: int, name: str) -> int:
    """Open ``name`` for write on node ``pnn + 1`` (and close it): its NTSTATUS."""
    with _client(cluster, pnn) as client:
        return status_of(lambda: client.open(name, WRITE, SHARE_ALL).close())


def _try_lock(cluster: SambaCluster, pnn: int, name: str) -> int:
    """Lock bytes 50-149 of ``name`` on node ``pnn + 1`` (closing the file
    lets go of it again): the lock's NTSTATUS."""
    with _client(cluster, pnn) as client:
        handle = client.open(name, WRITE, SHARE_ALL)
        status = status_of(lambda: client.lock(handle, 50, 100))
        handle.close()
        return status


def _outcome(attempt: Callable[[], int]) -> str:
    """"ok", or why not: an NTSTATUS, or an error on the way (a survivor's
    smbd may time out waiting for a record the dead node owns)."""
    try:
        status = attempt()
    except (SMBException, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok" if status == 0 else f"0x{status:08x}"


def _deadline(crash: Crash, recovered: float) -> float:
    return max(crash.killed_at + crash.lease, recovered) + MARGIN


def _late(crash: Crash, deadline: float) -> str:
    return f"{deadline - crash.killed_at:.1f} s after node 1's death (lease {crash.lease:g} s),"


def _ctdb_status(crash: Crash) -> str:
    return "ctdb status: " + crash.cluster.ctdb.nodes[SURVIVORS[0]].ctdb("status", check=False)


def _opens(cluster: SambaCluster, pnn: int, name: str, fast: bool) -> dict[str, dict[str, Any]]:
    """smbstatus's opens of ``name`` on node ``pnn + 1``, by "vnn:pid/share_file_id"."""
    samba = cluster.sambas[pnn]
    out = samba.run_tool(["smbstatus", "-L", "--json", *(["--fast"] if fast else []), "-s", str(samba.conf)])
    files = json.loads(out.stdout).get("open_files", {})
    return next((f.get("opens", {}) for f in files.values() if f.get("filename") == name), {})


def _only_open(cluster: SambaCluster, pnn: int, name: str, fast: bool) -> dict[str, Any]:
    opens = _opens(cluster, pnn, name, fast)
    assert len(opens) == 1, f"smbstatus on node {pnn + 1} lists {len(opens)} opens of {name}, not one: {opens}"
    return next(iter(opens.values()))


def _same_open(entry: dict[str, Any], other: dict[str, Any]) -> bool:
    return (entry.get("server_id") == other.get("server_id")
            and entry.get("share_file_id") == other.get("share_file_id")
            and bool(entry.get("oplock", {}).get("BATCH")))


def _open_id(entry: dict[str, Any]) -> str:
    server = entry.get("server_id", {})
    return f"{server.get('vnn')}:{server.get('pid')}/{entry.get('share_file_id')}"
