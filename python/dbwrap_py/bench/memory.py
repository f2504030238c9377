"""Memory of smbd's client processes: native tdb against the bridge per adapter.

smbd forks one process per client connection. With N connections held open
(smbtorture path-contention-shared with nprocs=N, busy opening and closing
files), this reads /proc/<pid>/smaps_rollup of each client process: RSS, and
PSS (proportional set size: each shared page divided among the processes
sharing it, so pages smbd's parent shares through fork count once in total).
The gain of the bridge is the mean PSS of a bridged client process less the
native one measured in the same run. In proxy mode the node daemon holds
the adapters for every client process; its own RSS, PSS and threads are
read at the same moment and reported apart (``daemon_*``).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dbwrap_py.samba import ThrowawaySamba
from dbwrap_py.smbtorture import torture_command

NATIVE = "native"
PROC = Path("/proc")


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """The ``Name: N kB`` lines of smaps_rollup, as KiB."""
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name.strip()] = int(parts[0])
    return fields


def parent_pid(stat: str) -> int:
    """The PPID field of /proc/<pid>/stat (the name in brackets may hold spaces)."""
    return int(stat.rpartition(")")[2].split()[1])


def children_of(pid: int, proc: Path = PROC) -> set[int]:
    """PIDs whose parent is ``pid``."""
    children = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if parent_pid((entry / "stat").read_text()) == pid:
                children.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return children


@dataclass
class ProcessMemory:
    pid: int
    rss_kib: int
    pss_kib: int
    #: threads in the process (a client library's own threads show here)
    threads: int = 1


def process_memory(pid: int, proc: Path = PROC) -> ProcessMemory | None:
    try:
        fields = parse_smaps_rollup((proc / str(pid) / "smaps_rollup").read_text())
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    threads = next((int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("Threads:")), 1)
    return ProcessMemory(pid, fields.get("Rss", 0), fields.get("Pss", 0), threads)


@dataclass
class MemoryRow:
    """Client processes of one backend at one connection count."""

    backend: str
    connections: int
    processes: int
    rss_kib_mean: float
    rss_kib_median: float
    pss_kib_mean: float
    pss_kib_median: float
    pss_kib_total: int
    parent_rss_kib: int
    parent_pss_kib: int
    threads_median: float = 1
    #: the node daemon serving these processes (proxy mode; zeros without one)
    daemon_rss_kib: int = 0
    daemon_pss_kib: int = 0
    daemon_threads: int = 0


def summarize(backend: str, connections: int, clients: Sequence[ProcessMemory],
              parent: ProcessMemory | None, daemon: ProcessMemory | None = None) -> MemoryRow:
    rss = [p.rss_kib for p in clients] or [0]
    pss = [p.pss_kib for p in clients] or [0]
    return MemoryRow(backend, connections, len(clients),
                     round(statistics.mean(rss), 1), statistics.median(rss),
                     round(statistics.mean(pss), 1), statistics.median(pss), sum(pss),
                     parent.rss_kib if parent else 0, parent.pss_kib if parent else 0,
                     statistics.median([p.threads for p in clients] or [1]),
                     daemon.rss_kib if daemon else 0, daemon.pss_kib if daemon else 0,
                     daemon.threads if daemon else 0)


def daemon_pid(socket_path: str, proc: Path = PROC) -> int | None:
    """The node daemon listening on ``socket_path``: the process whose
    command line runs the proxy daemon with that socket."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dbwrap_py.proxy.daemon" in argv or b"proxy-daemon" in argv:
            if socket_path.encode() in argv:
                return int(entry.name)
    return None


def _wait_for_clients(smbd: int, helpers: set[int], wanted: int, timeout: float) -> set[int]:
    """smbd's new children, once ``wanted`` are up (or at the timeout)."""
    deadline = time.monotonic() + timeout
    clients: set[int] = set()
    while time.monotonic() < deadline:
        clients = children_of(smbd) - helpers
        if len(clients) >= wanted:
            break
        time.sleep(0.2)
    return clients


def _stop(process: subprocess.Popen) -> None:
    """End smbtorture and the children it forked, by its PID (its own session)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def measure_held(samba: ThrowawaySamba, backend: str, connections: int, settle: float = 1.5,
                 hold: int = 6, connect_timeout: float = 90, daemon: int | None = None) -> MemoryRow:
    """Hold ``connections`` busy connections and read their smbd processes'
    memory, and the node daemon's (``daemon``, its PID) in proxy mode."""
    smbd = samba.pid
    helpers = children_of(smbd)
    command = torture_command(samba, "smb2.bench.path-contention-shared",
                              f"torture:timelimit={hold}", f"torture:nprocs={connections}")
    # cwd: smbtorture, stopped here by signal, leaves its smbtorture* folder behind
    torture = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, cwd=samba.root)
    try:
        _wait_for_clients(smbd, helpers, connections, connect_timeout)
        time.sleep(settle)  # the connections are busy opening files by now
        clients = children_of(smbd) - helpers
        memory = [m for m in map(process_memory, sorted(clients)) if m is not None]
        row = summarize(backend, connections, memory, process_memory(smbd),
                        process_memory(daemon) if daemon else None)
    finally:
        _stop(torture)
    _wait_for_clients_gone(smbd, helpers)
    return row


def _wait_for_clients_gone(smbd: int, helpers: set[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and children_of(smbd) - helpers:
        time.sleep(0.2)


def measure(sambas: Mapping[str, ThrowawaySamba], connection_counts: Iterable[int],
            on_start: Callable[[str, int], None] = lambda *_: None,
            on_row: Callable[[MemoryRow], None] = lambda _: None,
            daemons: Mapping[str, int] | None = None) -> list[MemoryRow]:
    """Every backend at every connection count, native first at each count;
    ``daemons``: the node daemon's PID of each backend in proxy mode."""
    rows = []
    for connections in connection_counts:
        for backend, samba in sambas.items():
            on_start(backend, connections)
            row = measure_held(samba, backend, connections, daemon=(daemons or {}).get(backend))
            rows.append(row)
            on_row(row)
    return rows


def gains(rows: Sequence[MemoryRow]) -> list[dict]:
    """Per bridged backend and connection count: mean PSS and RSS per client
    process less native's, in KiB, and PSS as a ratio to native."""
    native = {r.connections: r for r in rows if r.backend == NATIVE}
    result = []
    for row in rows:
        base = native.get(row.connections)
        if row.backend == NATIVE or base is None or not base.pss_kib_mean:
            continue
        result.append({
            "backend": row.backend,
            "connections": row.connections,
            "pss_gain_kib": round(row.pss_kib_mean - base.pss_kib_mean, 1),
            "rss_gain_kib": round(row.rss_kib_mean - base.rss_kib_mean, 1),
            "pss_ratio": round(row.pss_kib_mean / base.pss_kib_mean, 2),
            # the daemon's PSS shared out over the connections it serves
            "pss_gain_with_daemon_kib": round(row.pss_kib_mean - base.pss_kib_mean
                                              + row.daemon_pss_kib / max(row.processes, 1), 1),
        })
    return result


def table_lines(rows: Sequence[MemoryRow]) -> list[str]:
    """Per client process: mean RSS and PSS in MiB, and PSS over native's."""
    by_gain = {(g["backend"], g["connections"]): g for g in gains(rows)}
    lines = [f"{'backend':<30}{'conns':>6}{'procs':>6}{'RSS MiB':>9}{'PSS MiB':>9}"
             f"{'PSS vs native':>18}{'threads':>9}{'daemon RSS/PSS MiB, threads':>30}"]
    for row in rows:
        gain = by_gain.get((row.backend, row.connections))
        extra = f"{gain['pss_gain_kib']:+.0f} KiB ({gain['pss_ratio']:.2f}x)" if gain else "-"
        daemon = (f"{row.daemon_rss_kib / 1024:.1f}/{row.daemon_pss_kib / 1024:.1f}, "
                  f"{row.daemon_threads}" if row.daemon_threads else "-")
        lines.append(f"{row.backend:<30}{row.connections:>6}{row.processes:>6}"
                     f"{row.rss_kib_mean / 1024:>9.1f}{row.pss_kib_mean / 1024:>9.1f}{extra:>18}"
                     f"{row.threads_median:>9g}{daemon:>30}")
    return lines


def as_dicts(rows: Sequence[MemoryRow]) -> list[dict]:
    return [asdict(r) for r in rows]


def write_json(path: Path, rows: Sequence[MemoryRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "smbd client process memory (smaps_rollup)",
                                "rows": as_dicts(rows), "gains": gains(rows)}, indent=2) + "\n")
