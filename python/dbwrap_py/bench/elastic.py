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
* leave: SambaCluster.leave_node, in ctdb's order: ``ctdb stop`` through
  node 2's ctdbd, then its smbd, node agent (which hands its records back)
  and ctdbd stopped;
* join: a fourth node, listed in ctdb's nodes file but never started
  (ClusterSetup.spare_nodes; ctdb sees it DISCONNECTED), joins:
  SambaCluster.join_node starts its ctdbd, waits for ctdb's recovery, then
  starts its node agent and smbd. Its step ends when its smbd serves.

The clients are open_loop's (build/smb_open_loop, libsmbclient: each
client opens and closes one file of the share in a loop, counted into bins
of ``bin_seconds``, 0.5 s by default), or smbtorture's path-contention-
shared (``client=smbtorture``), whose own per-second samples are its only
rate (1 s bins). Both open one file on every client: one hot record. A
sample labelled t counts the opens of the bin that ends t seconds after
the clients started, as opens per second.
"""

from __future__ import annotations

import dataclasses
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
from dbwrap_py.cluster.samba_cluster import ClusterError, SambaCluster
from dbwrap_py.errors import ConfigError
from dbwrap_py.bench.open_loop import open_loop
from dbwrap_py.smbtorture import Rates, path_contention_unclist

KILL, LEAVE, JOIN = "kill", "leave", "join"
EVENTS = (KILL, LEAVE, JOIN)
#: the node that is killed or leaves; the node that joins (a spare one);
#: the clients use the others
CHANGING = 2
JOINING = 3
CLIENT_NODES = (0, 1)
DEFAULT_ADAPTERS = "etcd+cache"
#: a fraction of the before-rate: under STALL a second is a stall second;
#: from RECOVERED on the clients are back
STALL, RECOVERED = 0.5, 0.9
#: the warm-up on a fresh cluster: one client, not recorded
WARMUP_SECONDS = 2
#: the clients: OPEN_LOOP (bins of any width) or SMBTORTURE (1 s samples)
OPEN_LOOP, SMBTORTURE = "open-loop", "smbtorture"
CLIENTS = (OPEN_LOOP, SMBTORTURE)
DEFAULT_BIN = 0.5
NOTE = ("{what}, clients on nodes 0 and 1; node 2 is killed or leaves, or a fourth node joins, at the "
        "dotted line. One host: the nodes, their backend and the clients share {cpus} CPU cores; {bins}.")
WHAT = {OPEN_LOOP: "open+close of one file in a loop (libsmbclient)",
        SMBTORTURE: "smb2.bench.path-contention-shared"}


# -- what is run -----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One action on node ``pnn``, ``at`` seconds after the clients started."""

    action: str  # KILL, LEAVE or JOIN
    at: float
    pnn: int = CHANGING


def schedule(event: str, at: float) -> list[Step]:
    """The steps of ``event``."""
    if event in (KILL, LEAVE):
        return [Step(event, at)]
    if event == JOIN:
        return [Step(JOIN, at, JOINING)]
    raise ConfigError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")


def spare_nodes(event: str) -> int:
    """The nodes ``event``'s cluster keeps to join later (ClusterSetup.spare_nodes)."""
    return 1 if event == JOIN else 0


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


def perform(cluster: SambaCluster, step: Step) -> None:
    """``step``'s action on its node: its crash, its clean leave, or its join."""
    if step.action == KILL:
        cluster.kill_node(step.pnn)
    elif step.action == LEAVE:
        cluster.leave_node(step.pnn)
    elif step.action == JOIN:
        cluster.join_node(step.pnn)
    else:
        raise ConfigError(f"unknown action {step.action!r}")


# -- one run ---------------------------------------------------------------------


@dataclass
class Analysis:
    """What the clients saw around the event (opens/s in bins of ``bin_seconds``)."""

    before: float  # median of the bins before the event
    worst: float  # the fewest opens/s in a bin after it
    stall_seconds: float  # the bins after it below STALL of before, in seconds
    #: the longest run of such bins, in seconds: the window the issue bounds
    longest_stall_seconds: float
    #: seconds from the event to the first bin back at RECOVERED of before
    #: after the first one under it (0: none under it); None: never back in the run
    recovery_seconds: float | None


def analyse(seconds: Sequence[float], opens: Sequence[float], at: float,
            bin_seconds: float = 1.0) -> Analysis | None:
    """The Analysis of samples labelled ``seconds`` (a sample labelled t
    counts the bin ending at t; before the event when most of that bin is)
    around an event at ``at``; None without a bin before and one after it.
    The first second, which includes the clients' first round trips, is
    left out of the before-rate when at least two bins remain."""
    before = [n for t, n in zip(seconds, opens) if _before(t, at, bin_seconds)]
    after = [(t, n) for t, n in zip(seconds, opens) if not _before(t, at, bin_seconds)]
    if not before or not after:
        return None
    first = max(1, round(1 / bin_seconds))
    rate = statistics.median(before[first:] if len(before) > first + 1 else before)
    under = [n < STALL * rate for _, n in after]
    return Analysis(before=float(rate), worst=float(min(n for _, n in after)),
                    stall_seconds=round(sum(under) * bin_seconds, 3),
                    longest_stall_seconds=round(_longest_run(under) * bin_seconds, 3),
                    recovery_seconds=_recovery(after, rate, at, bin_seconds))


def _longest_run(flags: Sequence[bool]) -> int:
    longest = current = 0
    for flag in flags:
        current = current + 1 if flag else 0
        longest = max(longest, current)
    return longest


def _before(t: float, at: float, bin_seconds: float = 1.0) -> bool:
    """Whether the bin ending at ``t`` lies mostly before ``at``
    (smbtorture's labels drift by hundredths: 6.02 ends the 6th second)."""
    return t - bin_seconds / 2 <= at


def _recovery(after: Sequence[tuple[float, float]], rate: float, at: float,
              bin_seconds: float = 1.0) -> float | None:
    dipped = False
    for t, n in after:
        if n < RECOVERED * rate:
            dipped = True
        elif dipped:
            return round(max(0.0, t - bin_seconds - at), 2)  # the bin that ends at t began a bin earlier
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
        self.cluster, self.steps = cluster, list(steps)
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
            time.sleep(max(0.0, self.began + step.at - time.monotonic()))
            self.started = time.monotonic() - self.began
            try:
                perform(self.cluster, step)
            except Exception as exc:  # reported with the run, never lost
                self.error = f"{step.action} of node {step.pnn} failed: {type(exc).__name__}: {exc}"
            self.took = time.monotonic() - self.began - self.started

    def join(self, timeout: float = 120.0) -> None:
        if self.began is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.error = f"the event still ran {timeout:g} s after the clients ended"


@dataclass(frozen=True)
class Load:
    """The clients of a run: how many, for how long, which program, its bins."""

    nprocs: int
    seconds: int
    client: str = OPEN_LOOP
    bin_seconds: float = DEFAULT_BIN

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ConfigError(f"--client {self.client!r}: one of {', '.join(CLIENTS)}")
        if self.client == SMBTORTURE and self.bin_seconds != 1.0:
            raise ConfigError("smbtorture's samples are a second each: --bin 1 with --client smbtorture")

    def run(self, cluster: SambaCluster, nprocs: int, seconds: int,
            on_running: Callable[[], None] | None = None) -> Rates:
        clients = [cluster.sambas[pnn] for pnn in CLIENT_NODES]
        if self.client == SMBTORTURE:
            return path_contention_unclist(clients, cluster.root, nprocs, seconds, on_running=on_running)
        return open_loop(clients, cluster.root, nprocs, seconds, self.bin_seconds, on_running=on_running)


def one_run(config: Configuration, event: str, load: Load, at: float) -> Run:
    """``event`` on a fresh cluster of ``config``, clients on CLIENT_NODES;
    a cluster that does not start is a failed run with its cause."""
    run = Run(config.label, event)
    steps = schedule(event, at)
    try:
        with SambaCluster(dataclasses.replace(config.setup(), spare_nodes=spare_nodes(event))) as cluster:
            warm = load.run(cluster, 1, WARMUP_SECONDS)
            if not warm.ok:
                raise ClusterError("the warm-up (1 client) failed: " + "; ".join(warm.cause[:3]))
            timer = EventTimer(cluster, steps)
            rates = load.run(cluster, load.nprocs, load.seconds, on_running=timer.start)
            timer.join()
            _record(run, rates, timer, at, load.bin_seconds)
    except (*START_ERRORS, subprocess.TimeoutExpired) as exc:
        run.cause.insert(0, f"{type(exc).__name__}: {exc}")
    return run


def _record(run: Run, rates: Rates, timer: EventTimer, at: float, bin_seconds: float) -> None:
    run.seconds, run.opens = list(rates.seconds), list(rates.opens)
    run.event_started = round(timer.started, 2) if timer.started is not None else None
    run.event_took = round(timer.took, 2) if timer.took is not None else None
    run.analysis = analyse(run.seconds, run.opens, at, bin_seconds)
    run.cause = list(rates.cause) + ([timer.error] if timer.error else [])
    if timer.began is None:
        run.cause.append("the clients never started: the event was not run")
    run.ok = rates.ok and not timer.error and timer.began is not None


def run_all(configs: Sequence[Configuration], events: Sequence[str], load: Load,
            at: float, say: Callable[[str], None] = print) -> list[Run]:
    """Every event for every configuration, each on a fresh cluster; a
    failed run is followed by its cause. Ctrl-C ends with what was run."""
    runs: list[Run] = []
    try:
        for event in events:
            for config in configs:
                say(f"  {event:<5} {config.label:<28} ...")
                run = one_run(config, event, load, at)
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
        return ["-"] * 5
    back = "never" if a.recovery_seconds is None else f"{a.recovery_seconds:g} s"
    return [f"{a.before:.0f}", f"{a.worst:.0f}", f"{a.stall_seconds:g}", f"{a.longest_stall_seconds:g}", back]


def run_line(run: Run) -> str:
    before, worst, stalls, longest, back = _cells(run)
    took = f", step took {run.event_took:g} s" if run.event_took is not None else ""
    return (f"{'ok' if run.ok else 'FAILED'}: before {before}/s, worst {worst}/s, {stalls} s under half "
            f"(longest {longest} s), back in {back}{took}")


HEADER = ("event", "configuration", "before/s", "worst/s", "under half s", "longest s", "back to 90%", "")


def table_lines(runs: Sequence[Run]) -> list[str]:
    """A row per run: the before-rate, the worst second, the stall seconds,
    the time back to RECOVERED; FAILED marks a run that did not end well."""
    rows = [HEADER] + [(r.event, r.label, *_cells(r), "" if r.ok else "FAILED") for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in
                      enumerate(zip(row, widths))).rstrip() for row in rows]


def bins_text(client: str, bin_seconds: float) -> str:
    return "1 s bins (smbtorture's own samples)" if client == SMBTORTURE else f"{bin_seconds:g} s bins"


def note(client: str = OPEN_LOOP, bin_seconds: float = DEFAULT_BIN) -> str:
    return NOTE.format(what=WHAT[client], cpus=os.cpu_count(), bins=bins_text(client, bin_seconds))


def write_json(path: Path, runs: Sequence[Run], configs: Sequence[Configuration],
               settings: Mapping[str, object]) -> None:
    """``settings``: the run's, with its ``client`` and ``bin_seconds``."""
    client = str(settings.get("client", SMBTORTURE))
    bin_seconds = float(settings.get("bin_seconds", 1.0))  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": f"{WHAT[client]}, clients on nodes 0 and 1; node 2 is killed or leaves, or node 3 joins",
        "bins": bins_text(client, bin_seconds),
        "stall": f"a bin after the event under {STALL:g} of the before-rate",
        "recovered": f"{RECOVERED:g} of the before-rate",
        "note": note(client, bin_seconds),
        **settings,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "configurations": [c.describe() for c in configs],
        "runs": [asdict(r) for r in runs],
    }, indent=2) + "\n")


def chart(runs: Sequence[Run], path: Path, at: float, subtitle: str = "", bin_seconds: float = 1.0) -> Path:
    """Opens/s against time, a panel per event, a line per configuration."""
    from dbwrap_py.bench.charts import timeline_chart

    panels = {event: {r.label: list(zip(r.seconds, r.opens)) for r in runs if r.event == event}
              for event in dict.fromkeys(r.event for r in runs)}
    titles = {KILL: f"node {CHANGING} killed", LEAVE: f"node {CHANGING} leaves (ctdb stop, then stopped)",
              JOIN: f"node {JOINING} joins (a fourth node starts)"}
    return timeline_chart({titles.get(e, e): lines for e, lines in panels.items()}, path, at,
                          "Samba cluster, n=3: opens/s of the other nodes' clients", subtitle or note(),
                          bins=f"{bin_seconds:g} s")


def write_results(out: Path, runs: Sequence[Run], configs: Sequence[Configuration],
                  settings: Mapping[str, object], at: float) -> list[Path]:
    """``out`` (JSON) and beside it the chart (.png); their paths."""
    write_json(out, runs, configs, settings)
    files = [out]
    if any(r.opens for r in runs):
        bin_seconds = float(settings.get("bin_seconds", 1.0))  # type: ignore[arg-type]
        subtitle = note(str(settings.get("client", SMBTORTURE)), bin_seconds)
        files.append(chart(runs, out.with_suffix(".png"), at, subtitle, bin_seconds))
    return files


def chosen(adapters: str, options: Sequence[str]) -> list[Configuration]:
    """ctdb, then bench cluster's configurations of ``adapters``."""
    return configurations(adapters or DEFAULT_ADAPTERS, options)
