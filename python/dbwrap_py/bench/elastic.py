"""`make bench-elastic`: what clients of the surviving nodes see, second by
second, when a node of a three-node Samba cluster is killed, leaves or
joins, with ctdb keeping every database and with an adapter (issue 41).

With ctdb, a membership change re-homes records through a database
recovery that freezes every database; with an adapter (and its node cache)
the records of share modes, byte-range locks and leases do not move, but
ctdb still recovers the databases it keeps (sessions, tree connects, g_lock)
and carries the messaging.

Each configuration (bench cluster's Configuration) and event runs on a
fresh cluster: smbtorture's path-contention-shared with its clients on
nodes 0 and 1 only (``--unclist``), and the event on node 2 ``at`` seconds
after smbtorture's clients started (its "Running for" line):

* kill: SambaCluster.kill_node (SIGKILL to its smbd, ctdbd, node agent);
* leave: ``ctdb stop`` through node 2's ctdbd (it stays up, inactive);
* join: ``ctdb stop`` before the clients start, ``ctdb continue`` at ``at``.

The bins are smbtorture's own per-second samples (1 s): it prints one open
count per second of its run, nothing finer, so a finer bin would need
another client. A sample labelled t counts the opens of the second that
ends t seconds after the clients started.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dbwrap_py.bench.cluster import START_ERRORS, Configuration, configurations
from dbwrap_py.cluster.ctdb import CtdbError, node_states
from dbwrap_py.cluster.samba_cluster import ClusterError, SambaCluster
from dbwrap_py.errors import ConfigError
from dbwrap_py.smbtorture import Rates, path_contention_unclist

KILL, LEAVE, JOIN = "kill", "leave", "join"
EVENTS = (KILL, LEAVE, JOIN)
#: what a step does to the changing node
STOP, CONTINUE = "ctdb stop", "ctdb continue"
#: the node that changes; the clients use the others
CHANGING = 2
CLIENT_NODES = (0, 1)
DEFAULT_ADAPTERS = "etcd+cache"
#: a fraction of the before-rate: under STALL a second is a stall second;
#: from RECOVERED on the clients are back
STALL, RECOVERED = 0.5, 0.9
#: the warm-up on a fresh cluster: one client, not recorded
WARMUP_SECONDS = 2
#: seconds for ctdb to settle after ``ctdb stop`` before the clients start
SETTLE_SECONDS = 60.0
NOTE = ("smb2.bench.path-contention-shared, clients on nodes 0 and 1, node 2 changes at the dotted line. "
        "One host: the 3 nodes, their backend and smbtorture share {cpus} CPU cores; 1 s bins "
        "(smbtorture's own samples).")


# -- what is run -----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One action on the changing node: before the clients start (``at``
    None) or ``at`` seconds after they did."""

    action: str  # KILL, STOP or CONTINUE
    at: float | None = None


def schedule(event: str, at: float) -> list[Step]:
    """The steps of ``event``, those before the clients start first."""
    if event == KILL:
        return [Step(KILL, at)]
    if event == LEAVE:
        return [Step(STOP, at)]
    if event == JOIN:
        return [Step(STOP), Step(CONTINUE, at)]
    raise ConfigError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")


def parse_events(text: str) -> list[str]:
    """``--events``: a comma list of EVENTS, repeats dropped, in the order given."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in EVENTS]
    if unknown or not names:
        raise ConfigError(f"--events {text!r}: give one or more of {', '.join(EVENTS)}")
    return names


def check_timing(at: float, seconds: int, nprocs: int) -> None:
    """Refuses an event outside the run, or no second before or after it."""
    if nprocs < 1:
        raise ConfigError(f"--nprocs {nprocs}: at least one client")
    if not 1 <= at <= seconds - 1:
        raise ConfigError(f"--at {at:g}: the event needs a second of the run before it and one after "
                          f"(1 to {seconds - 1} with --time {seconds})")


def perform(cluster: SambaCluster, action: str, pnn: int = CHANGING) -> None:
    """``action`` on node ``pnn``: its crash, or a ctdb command through its own ctdbd."""
    if action == KILL:
        cluster.kill_node(pnn)
    elif action in (STOP, CONTINUE):
        cluster.ctdb.nodes[pnn].ctdb(action.split()[1], timeout=60)
    else:
        raise ConfigError(f"unknown action {action!r}")


def wait_settled(cluster: SambaCluster, pnn: int, state: str, timeout: float = SETTLE_SECONDS) -> None:
    """Until node 0 sees node ``pnn`` in ``state`` (e.g. STOPPED) and recovery is done."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = cluster.ctdb.nodes[0].ctdb("status", timeout=15, check=False)
        if state in node_states(status).get(pnn, "") and "Recovery mode:NORMAL" in status:
            return
        time.sleep(0.5)
    raise CtdbError(f"node {pnn} not {state} with recovery done after {timeout:g} s:\n{status}")


# -- one run ---------------------------------------------------------------------


@dataclass
class Analysis:
    """What the clients saw around the event (opens/s, 1 s bins)."""

    before: float  # median of the seconds before the event
    worst: float  # the fewest opens in a second after it
    stall_seconds: int  # seconds after it below STALL of before
    #: seconds from the event to the first second back at RECOVERED of before
    #: after the first one under it (0: none under it); None: never back in the run
    recovery_seconds: float | None


def analyse(seconds: Sequence[float], opens: Sequence[float], at: float) -> Analysis | None:
    """The Analysis of samples labelled ``seconds`` (a sample labelled t
    counts the second ending at t; before the event when most of that
    second is) around an event at ``at``; None without
    a second before and one after it. The first second, which includes the
    clients' first round trips, is left out of the before-rate when at
    least two others remain."""
    before = [n for t, n in zip(seconds, opens) if _before(t, at)]
    after = [(t, n) for t, n in zip(seconds, opens) if not _before(t, at)]
    if not before or not after:
        return None
    rate = statistics.median(before[1:] if len(before) > 2 else before)
    return Analysis(before=float(rate), worst=float(min(n for _, n in after)),
                    stall_seconds=sum(1 for _, n in after if n < STALL * rate),
                    recovery_seconds=_recovery(after, rate, at))


def _before(t: float, at: float) -> bool:
    """Whether the second ending at ``t`` lies mostly before ``at``
    (smbtorture's labels drift by hundredths: 6.02 ends the 6th second)."""
    return t - 0.5 <= at


def _recovery(after: Sequence[tuple[float, float]], rate: float, at: float) -> float | None:
    dipped = False
    for t, n in after:
        if n < RECOVERED * rate:
            dipped = True
        elif dipped:
            return round(max(0.0, t - 1 - at), 2)  # the second that ends at t began at t - 1
    return None if dipped else 0.0


@dataclass
class Run:
    """One configuration and event on a fresh cluster."""

    label: str
    event: str
    ok: bool = False
    seconds: list[float] = field(default_factory=list)
    opens: list[int] = field(default_factory=list)
    #: when the event's last step began and how long it took (seconds since the clients started)
    event_started: float | None = None
    event_took: float | None = None
    analysis: Analysis | None = None
    #: why the run failed (smbtorture, smbd's logs, the step), one line each
    cause: list[str] = field(default_factory=list)


class EventTimer:
    """Runs the timed steps of a schedule, each ``at`` seconds after start()."""

    def __init__(self, cluster: SambaCluster, steps: Sequence[Step]) -> None:
        self.cluster, self.steps = cluster, [s for s in steps if s.at is not None]
        self.began: float | None = None
        self.started: float | None = None
        self.took: float | None = None
        self.error = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:  # smbtorture's on_running: returns at once
        self.began = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        assert self.began is not None
        for step in self.steps:
            time.sleep(max(0.0, self.began + step.at - time.monotonic()))  # type: ignore[operator]
            self.started = time.monotonic() - self.began
            try:
                perform(self.cluster, step.action)
            except Exception as exc:  # reported with the run, never lost
                self.error = f"{step.action} on node {CHANGING} failed: {type(exc).__name__}: {exc}"
            self.took = time.monotonic() - self.began - self.started

    def join(self, timeout: float = 120.0) -> None:
        if self.began is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.error = f"the event on node {CHANGING} still ran {timeout:g} s after smbtorture ended"


def one_run(config: Configuration, event: str, nprocs: int, seconds: int, at: float) -> Run:
    """``event`` on a fresh cluster of ``config``, clients on CLIENT_NODES;
    a cluster that does not start is a failed run with its cause."""
    run = Run(config.label, event)
    steps = schedule(event, at)
    try:
        with SambaCluster(config.setup()) as cluster:
            clients = [cluster.sambas[pnn] for pnn in CLIENT_NODES]
            for step in steps:
                if step.at is None:
                    perform(cluster, step.action)
                    wait_settled(cluster, CHANGING, "STOPPED")
            warm = path_contention_unclist(clients, cluster.root, 1, WARMUP_SECONDS)
            if not warm.ok:
                raise ClusterError("the warm-up (1 client) failed: " + "; ".join(warm.cause[:3]))
            timer = EventTimer(cluster, steps)
            rates = path_contention_unclist(clients, cluster.root, nprocs, seconds, on_running=timer.start)
            timer.join()
            _record(run, rates, timer, at)
    except (*START_ERRORS, subprocess.TimeoutExpired) as exc:
        run.cause.insert(0, f"{type(exc).__name__}: {exc}")
    return run


def _record(run: Run, rates: Rates, timer: EventTimer, at: float) -> None:
    run.seconds, run.opens = list(rates.seconds), list(rates.opens)
    run.event_started = round(timer.started, 2) if timer.started is not None else None
    run.event_took = round(timer.took, 2) if timer.took is not None else None
    run.analysis = analyse(run.seconds, run.opens, at)
    run.cause = list(rates.cause) + ([timer.error] if timer.error else [])
    if timer.began is None:
        run.cause.append("smbtorture's clients never started: the event was not run")
    run.ok = rates.ok and not timer.error and timer.began is not None


def run_all(configs: Sequence[Configuration], events: Sequence[str], nprocs: int, seconds: int,
            at: float, say: Callable[[str], None] = print) -> list[Run]:
    """Every event for every configuration, each on a fresh cluster; a
    failed run is followed by its cause. Ctrl-C ends with what was run."""
    runs: list[Run] = []
    try:
        for event in events:
            for config in configs:
                say(f"  {event:<5} {config.label:<28} ...")
                run = one_run(config, event, nprocs, seconds, at)
                runs.append(run)
                say("    " + run_line(run))
                for line in run.cause[:20]:
                    say(f"      {line}")
    except KeyboardInterrupt:
        say("interrupted (Ctrl-C): the results hold the runs before")
    return runs


# -- the results -----------------------------------------------------------------


def _cells(run: Run) -> list[str]:
    a = run.analysis
    if a is None:
        return ["-"] * 4
    back = "never" if a.recovery_seconds is None else f"{a.recovery_seconds:.0f} s"  # 1 s bins
    return [f"{a.before:.0f}", f"{a.worst:.0f}", str(a.stall_seconds), back]


def run_line(run: Run) -> str:
    before, worst, stalls, back = _cells(run)
    took = f", step took {run.event_took:g} s" if run.event_took is not None else ""
    return (f"{'ok' if run.ok else 'FAILED'}: before {before}/s, worst {worst}/s, {stalls} stall s, "
            f"back in {back}{took}")


HEADER = ("event", "configuration", "before/s", "worst/s", "stall s", "back to 90%", "")


def table_lines(runs: Sequence[Run]) -> list[str]:
    """A row per run: the before-rate, the worst second, the stall seconds,
    the time back to RECOVERED; FAILED marks a run that did not end well."""
    rows = [HEADER] + [(r.event, r.label, *_cells(r), "" if r.ok else "FAILED") for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in
                      enumerate(zip(row, widths))).rstrip() for row in rows]


def note() -> str:
    return NOTE.format(cpus=os.cpu_count())


def write_json(path: Path, runs: Sequence[Run], configs: Sequence[Configuration],
               settings: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": "smb2.bench.path-contention-shared, clients on nodes 0 and 1; node 2 changes",
        "bins": "1 s: smbtorture's per-second samples",
        "stall": f"a second after the event under {STALL:g} of the before-rate",
        "recovered": f"{RECOVERED:g} of the before-rate",
        "note": note(),
        **settings,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "configurations": [c.describe() for c in configs],
        "runs": [asdict(r) for r in runs],
    }, indent=2) + "\n")


def chart(runs: Sequence[Run], path: Path, at: float) -> Path:
    """Opens/s against time, a panel per event, a line per configuration."""
    from dbwrap_py.bench.charts import timeline_chart

    panels = {event: {r.label: list(zip(r.seconds, r.opens)) for r in runs if r.event == event}
              for event in dict.fromkeys(r.event for r in runs)}
    titles = {KILL: f"node {CHANGING} killed", LEAVE: f"node {CHANGING} leaves (ctdb stop)",
              JOIN: f"node {CHANGING} joins (ctdb continue)"}
    return timeline_chart({titles.get(e, e): lines for e, lines in panels.items()}, path, at,
                          "Samba cluster, n=3: opens/s of the other nodes' clients", note())


def write_results(out: Path, runs: Sequence[Run], configs: Sequence[Configuration],
                  settings: Mapping[str, object], at: float) -> list[Path]:
    """``out`` (JSON) and beside it the chart (.png); their paths."""
    write_json(out, runs, configs, settings)
    files = [out]
    if any(r.opens for r in runs):
        files.append(chart(runs, out.with_suffix(".png"), at))
    return files


def chosen(adapters: str, options: Sequence[str]) -> list[Configuration]:
    """ctdb, then bench cluster's configurations of ``adapters``."""
    return configurations(adapters or DEFAULT_ADAPTERS, options)
