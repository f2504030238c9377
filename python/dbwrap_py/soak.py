"""Soak: path-contention points against one long-lived bridged Samba, until one fails.

A benchmark sweep measures a few points; a wedge (a record lock nobody
releases) shows only after many. ``soak()`` keeps one backend (the
adapter's throwaway server), one node agent and one bridged smbd with the
node cache up, runs ``smb2.bench.path-contention-shared`` point after
point (the connection counts alternate), and stops at the first failed
point. It then says everything that explains it: the cause lines (smbd's
log, smbtorture), what the backend holds (the adapter's ``diagnose``:
locks, claims, release requests, its server's log), which processes hold
locks on the node's local tdb files and where they are blocked, smbd's and
the agent's logs, and whether the next points fail too (a wedge stays).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.samba import ThrowawaySamba
from dbwrap_py.servers import backend_options
from dbwrap_py.smbtorture import Rates, path_contention, setup_for
from dbwrap_py.testing.hooks import hooks_for

_TAIL = 40


@dataclass
class SoakResult:
    points: int = 0
    failed_at: int | None = None
    #: (connections, opens/s) of the points measured, in order
    rates: list[tuple[int, float]] = field(default_factory=list)
    #: the report printed at the first failure
    report: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed_at is None


def _tail(path: Path, lines: int = _TAIL) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return [f"({path}: {exc})"]


def local_lock_holders(folder: Path) -> list[str]:
    """Processes holding fcntl locks on files under ``folder``, and where each waits."""
    inodes = {p.stat().st_ino: p.name for p in folder.glob("*") if p.is_file()}
    lines, pids = [], set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # "1: POSIX ADVISORY WRITE 1234 fd:01:5678 0 EOF", or "-> ..." for a waiter
        waiting = fields[1] == "->"
        if waiting:
            fields = fields[1:]
        try:
            pid, inode = int(fields[4]), int(fields[5].split(":")[2])
        except (IndexError, ValueError):
            continue
        if inode in inodes:
            pids.add(pid)
            lines.append(f"{'waits for' if waiting else 'holds'} {fields[3]} lock"
                         f" {fields[6]}-{fields[7]} on {inodes[inode]}: pid {pid} ({_comm(pid)})")
    return (lines or ["(no locks on the node's local files)"]) + _backtraces(sorted(pids))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"


def _backtraces(pids: Sequence[int]) -> list[str]:
    """Where each lock holder or waiter is: gdb's backtrace when gdb is installed."""
    if not pids or shutil.which("gdb") is None:
        return []
    lines = []
    for pid in pids[:8]:
        result = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "bt 25"],
                                capture_output=True, text=True, timeout=60)
        frames = [l for l in result.stdout.splitlines() if l.startswith("#")]
        lines.append(f"-- pid {pid} ({_comm(pid)}):")
        lines.extend(f"   {f}" for f in frames[:25])
    return lines


def soak(adapter: str, points: int, nprocs: Sequence[int], seconds: int,
         options: Mapping[str, str], after_failure: int = 2,
         say: Callable[[str], None] = print) -> SoakResult:
    """Up to ``points`` points with the node cache on ``adapter``; stop at the first failure."""
    result = SoakResult()
    with backend_options(adapter, {"node_cache": "yes", **options}) as reach:
        cache_dir = Path(reach["node_cache_dir"])
        with ThrowawaySamba(setup_for("bridge", adapter, reach)) as samba:
            for index in range(points):
                n = nprocs[index % len(nprocs)]
                start = samba.log_position()
                rates = path_contention(samba, n, seconds)
                result.points += 1
                result.rates.append((n, rates.opens_per_second))
                say(f"point {index + 1}/{points}: {n} connections,"
                    f" {rates.opens_per_second:.0f} opens/s{'' if rates.ok else '  FAILED'}")
                if not rates.ok:
                    result.failed_at = index
                    result.report = _report(adapter, reach, index, n, rates, samba, start, cache_dir,
                                            seconds, nprocs, after_failure)
                    for line in result.report:
                        say(line)
                    break
    return result


def _report(adapter: str, options: Mapping[str, str], index: int, n: int, rates: Rates,
            samba: ThrowawaySamba, log_start: int, cache_dir: Path, seconds: int,
            nprocs: Sequence[int], after_failure: int) -> list[str]:
    lines = [f"== point {index + 1} failed ({n} connections): why"]
    lines += [f"   {c}" for c in rates.cause]
    lines += [f"== what {adapter} holds now"]
    lines += [f"   {l}" for l in hooks_for(adapter).diagnose(options)]
    lines += ["== locks on the node's local tdb files now"]
    lines += [f"   {l}" for l in local_lock_holders(cache_dir)]
    lines += ["== smbd's log during the point (last lines)"]
    lines += [f"   {l}" for l in samba.log_since(log_start).splitlines()[-_TAIL:]]
    lines += ["== the node agent's log (last lines)"] + [f"   {l}" for l in _tail(cache_dir / "agent.log")]
    for extra in range(after_failure):  # does it stay failed, as a wedge would?
        m = nprocs[(index + 1 + extra) % len(nprocs)]
        again = path_contention(samba, m, seconds)
        lines.append(f"== the next point ({m} connections): {again.opens_per_second:.0f} opens/s,"
                     f" {'ok' if again.ok else 'failed too: ' + (again.cause or ['?'])[0]}")
    return lines
