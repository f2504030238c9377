"""Where and why a client sweep stops: the point that failed, and its kind.

A sweep to hundreds of clients meets the machine's limits before the
backend's: clients that do not connect, a run that hangs past its time, or
memory (each client is an smbd process, with the adapter in it). The sweep
records the first such point of each configuration, measures nothing larger
for it, and says why, rather than crash or wait out timeout after timeout.

* failure(): the kind and one-line reason of a failed point, from what
  smbtorture printed;
* MemoryGuard: refuses a point whose clients would not fit in memory, from
  what the configuration's largest point so far used (MemoryWatch);
* Stop: what the results keep of it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.smbtorture import Rates

#: the kinds of stop, worst first in the results' eyes: none is a crash
CONNECT, TIMEOUT, MEMORY, ERROR = "connect", "timeout", "memory", "error"

_FAILED_OPENING = re.compile(r"Failed opening (\d+)/(\d+) connections")
_NTSTATUS = re.compile(r"NT_STATUS_\w+")
MEMINFO = Path("/proc/meminfo")


@dataclass
class Stop:
    """A configuration's sweep ended at ``nprocs`` clients in round ``round_index``."""

    nprocs: int
    round_index: int
    kind: str
    why: str
    #: the failed point's cause lines (smbd's logs, smbtorture), if it ran
    cause: list[str] = field(default_factory=list)

    def line(self, label: str) -> str:
        return (f"{label}: stops at {self.nprocs} clients (round {self.round_index + 1}): "
                f"{self.kind}: {self.why}")


def _statuses(output: str) -> list[str]:
    return list(dict.fromkeys(_NTSTATUS.findall(output)))


def failure(rates: Rates, nprocs: int) -> tuple[str, str]:
    """(kind, reason) of a failed point: clients that did not all connect,
    a run killed at its timeout, or another error (the first cause line)."""
    statuses = _statuses(rates.output)
    status = f" ({', '.join(statuses[:3])})" if statuses else ""
    opened = _FAILED_OPENING.search(rates.output)
    if opened:
        return CONNECT, f"only {opened.group(1)} of {opened.group(2)} clients connected{status}"
    if rates.timed_out:
        first = rates.cause[0] if rates.cause else "smbtorture timed out"
        return TIMEOUT, f"{first} with {nprocs} clients{status}"
    first = next((line for line in rates.cause if line.strip()), "smbtorture reported no rates")
    return ERROR, first


def mem_available_kib(meminfo: str) -> int:
    """MemAvailable of /proc/meminfo, in KiB (0 if absent)."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def mem_total_kib(meminfo: str) -> int:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def read_meminfo() -> str:
    return MEMINFO.read_text()


@dataclass
class MemoryGuard:
    """Refuses a point whose clients would not fit in memory.

    What a point at n clients took (MemAvailable before, less its lowest
    during the run) scaled to the next n: linear in clients, as each client
    is an smbd process of its own; the largest point measured gives the
    estimate (the cluster's own growth spread over most clients). Points
    under ``projects_from`` clients are not scaled up: another program's
    growth meanwhile would weigh too much on them. ``reserve_kib`` stays
    free for the rest of a shared machine."""

    reserve_kib: int
    projects_from: int = 16
    per_client_kib: float = 0.0
    measured_at: int = 0

    @classmethod
    def for_machine(cls, meminfo: str) -> "MemoryGuard":
        """Keeps 15% of memory, at least 2 GiB, for everything else."""
        return cls(reserve_kib=max(2 * 1024 * 1024, mem_total_kib(meminfo) * 15 // 100))

    def learn(self, nprocs: int, used_kib: int) -> None:
        if nprocs >= self.measured_at and used_kib > 0:
            self.per_client_kib, self.measured_at = used_kib / nprocs, nprocs

    def refusal(self, nprocs: int, available_kib: int) -> str | None:
        """Why ``nprocs`` clients will not be run, or None when they fit."""
        need = self.per_client_kib * nprocs
        room = available_kib - self.reserve_kib
        if self.measured_at < self.projects_from or need <= room:
            return None
        mib = 1024
        return (f"{nprocs} clients would take ~{need / mib:.0f} MiB "
                f"({self.per_client_kib / mib:.1f} MiB a client at {self.measured_at}); "
                f"{available_kib / mib:.0f} MiB available, {self.reserve_kib / mib:.0f} MiB kept free")


class MemoryWatch:
    """The most memory taken while the block runs: MemAvailable at entry
    less its lowest value, sampled every ``interval`` seconds."""

    def __init__(self, interval: float = 0.25, read=read_meminfo) -> None:
        self.interval = interval
        self._read = read
        self.start_kib = 0
        self.lowest_kib = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def used_kib(self) -> int:
        return max(0, self.start_kib - self.lowest_kib)

    def _sample(self) -> None:
        while not self._done.wait(self.interval):
            self.lowest_kib = min(self.lowest_kib, mem_available_kib(self._read()))

    def __enter__(self) -> "MemoryWatch":
        self.start_kib = self.lowest_kib = mem_available_kib(self._read())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
