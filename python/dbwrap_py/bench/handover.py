"""`dbwrap-py bench handover`: one hot record wanted on two nodes through
the node cache: how the locks divide between the nodes, and how long the
longest wait for it was (issue 41: fairness of the hand-over).

Node a runs ``a_procs`` processes, node b ``b_procs`` (by default 3 and
1: the busier node has waiters of its own whenever it hands the record
over). Each process locks the record, holds it ``hold_ms``, writes it back
incremented and lets it go, again and again for ``seconds``. A fair
hand-over gives every process about the same number of locks; an unfair
one lets node a's processes take the record back before node b's waiter
looks, and node b's process starves (its longest wait shows it).

The adapter is sqlite_leased by default: the node cache's protocol with
no server to start; ``--adapter`` takes another, on a throwaway server of
its own unless ``-o`` gives its reach.
Each process is bounded: it stops taking the lock at the end of the run,
and the run kills what is still there ``op_timeout`` plus 10 s later.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.database import Database, open_database
from dbwrap_py.nodecache.agent import NodeAgentProcess

KEY = b"hot"
#: the node agents' lease, seconds: short, as the node cache tests have it
TTL = 3.0
#: seconds past the run's end before the processes still there are killed
GRACE = 10.0


@dataclass
class Worker:
    """One process's share of the run."""

    node: str
    locks: int = 0
    #: seconds each lock took to be granted, summarised
    wait_p50_ms: float = 0.0
    wait_p99_ms: float = 0.0
    wait_max_ms: float = 0.0
    error: str = ""


@dataclass
class Result:
    adapter: str
    seconds: float
    hold_ms: float
    workers: list[Worker] = field(default_factory=list)
    #: the record's value after the run: every lock incremented it once
    final: int = 0

    @property
    def lost(self) -> int:
        """Increments the record does not show (0: none lost)."""
        return sum(w.locks for w in self.workers) - self.final

    def locks_per_process(self, node: str) -> float:
        mine = [w.locks for w in self.workers if w.node == node]
        return sum(mine) / len(mine) if mine else 0.0

    @property
    def fairness(self) -> float:
        """Node b's locks per process over node a's: 1.0 is fair, 0 is starved."""
        a = self.locks_per_process("a")
        return self.locks_per_process("b") / a if a else 0.0

    @property
    def longest_wait_ms(self) -> float:
        return max((w.wait_max_ms for w in self.workers), default=0.0)


def _open(adapter: str, options: Mapping[str, str], cache_dir: Path, name: str) -> Database:
    opts = {"node_cache": "yes", "node_cache_dir": str(cache_dir), **options}
    return open_database(name, 0, TDB_CLEAR_IF_FIRST, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, adapter,
                         [f"{k}={v}" for k, v in opts.items()])


def _work(db: Database, node: str, start: float, seconds: float, hold: float) -> Worker:
    """Lock, hold, increment, let go, until ``start + seconds``."""
    while time.monotonic() < start:
        time.sleep(0.001)
    waits: list[float] = []
    end = start + seconds
    while time.monotonic() < end:
        asked = time.monotonic()
        value = db.lock(KEY)
        waits.append(time.monotonic() - asked)
        if hold > 0:
            time.sleep(hold)
        db.unlock(KEY, str(int(value or b"0") + 1).encode())
    ordered = sorted(waits) or [0.0]
    return Worker(node, len(waits), statistics.median(ordered) * 1000,
                  ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, ordered[-1] * 1000)


def _fork_worker(adapter: str, options: Mapping[str, str], cache_dir: Path, name: str, node: str,
                 start: float, seconds: float, hold: float) -> tuple[int, int]:
    """A process running _work; (pid, the read end of its result pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own database handle, its result as JSON, then _exit
        os.close(read)
        try:
            db = _open(adapter, options, cache_dir, name)
            worker = _work(db, node, start, seconds, hold)
            db.close()
        except BaseException as exc:  # noqa: BLE001 - reported, never raised past the fork
            worker = Worker(node, error=f"{type(exc).__name__}: {exc}")
        os.write(write, json.dumps(asdict(worker)).encode())
        os._exit(0)
    os.close(write)
    return pid, read


def _collect(children: Sequence[tuple[int, int]], deadline: float) -> list[Worker]:
    """Each child's Worker; one killed at ``deadline`` says so."""
    workers = []
    for pid, read in children:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as f:
            text = f.read()
        workers.append(Worker(**json.loads(text)) if text else
                       Worker("?", error="killed: still waiting for the lock past the run's end"))
    return workers


def run(adapter: str = "sqlite_leased", options: Mapping[str, str] | None = None, a_procs: int = 3,
        b_procs: int = 1, seconds: float = 5.0, hold_ms: float = 0.5) -> Result:
    """The run; the two node agents, every process and a throwaway store
    started for it (an adapter with a server, given no reach) stopped at its end."""
    from dbwrap_py.testing.hooks import hooks_for

    with tempfile.TemporaryDirectory(prefix="dbwrap-py-handover-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        opts = dict(options or {})
        if adapter == "sqlite_leased":
            opts.setdefault("cluster_file", str(root / "cluster.sqlite"))
        else:
            server = hooks_for(adapter).throwaway_server(opts)
            if server is not None:
                opts.update(stack.enter_context(server))
        opts.setdefault("op_timeout", "10")
        name = str(root / "locking.tdb")
        with NodeAgentProcess(adapter, opts, root / "node-a", node="a", ttl=TTL) as a, \
                NodeAgentProcess(adapter, opts, root / "node-b", node="b", ttl=TTL) as b:
            keeper = _open(adapter, opts, a.cache_dir, name)  # open throughout: no later opener wipes
            try:
                keeper.lock(KEY)
                keeper.unlock(KEY, b"0")
                start = time.monotonic() + 2.0  # every process opened and waiting
                children = [_fork_worker(adapter, opts, node.cache_dir, name, node.node, start, seconds,
                                         hold_ms / 1000)
                            for node, count in ((a, a_procs), (b, b_procs)) for _ in range(count)]
                workers = _collect(children, start + seconds + float(opts["op_timeout"]) + GRACE)
                final = int(keeper.fetch(KEY) or b"0")
            finally:
                keeper.close()
    return Result(adapter, seconds, hold_ms, workers, final)


def report_lines(result: Result) -> list[str]:
    lines = [f"{'node':<5} {'locks':>7} {'wait p50 ms':>12} {'p99 ms':>9} {'max ms':>9}"]
    for w in result.workers:
        if w.error:
            lines.append(f"{w.node:<5} failed: {w.error}")
        else:
            lines.append(f"{w.node:<5} {w.locks:>7} {w.wait_p50_ms:>12.2f} {w.wait_p99_ms:>9.2f} "
                         f"{w.wait_max_ms:>9.1f}")
    lines.append(f"locks per process: node a {result.locks_per_process('a'):.0f}, node b "
                 f"{result.locks_per_process('b'):.0f} (fairness b/a {result.fairness:.2f}); "
                 f"longest wait {result.longest_wait_ms:.0f} ms")
    if result.lost:
        lines.append(f"LOST: the record shows {result.final}, {result.lost} increment(s) fewer than the locks")
    return lines
