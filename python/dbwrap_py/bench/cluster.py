"""`make bench-cluster`: path-contention-shared on a three-node Samba
cluster, each adapter against ctdb, as in the seed talks' chart
"Samba cluster, n=3, non-concurrent opens".

Each configuration is a SambaCluster: ctdb keeping every volatile database
(the reference), or an adapter keeping share modes, byte-range locks and
leases (smbXsrv_open_global node-local, as in the seed), with or without
the node cache. smbtorture spreads its clients over the three nodes
(``--unclist``).

One cluster runs at a time, from a fresh start, for all the client counts
of a round: an idle cluster (and its backend: Ceph, a JVM) would take
CPU from the one measured, and never two Cassandras run at once. Every
round measures every configuration, ctdb too, and every other round goes
through them in reverse order, so the load of this shared machine drifts
over all of them alike; the ratio to ctdb is taken per round and client
count, and its median reported. Everything shares this host's cores, so
only the ratios mean something.

A configuration stops at the fewest clients that failed in any round
(clients that do not connect, a timeout, another error) or would not fit
in memory (limits.py), and is not measured at more; the failed count is
tried again in the next round. The stop and its cause are in the results.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dbwrap_py.bench.limits import MEMORY, MemoryGuard, MemoryWatch, Stop, failure, mem_available_kib, \
    mem_total_kib, read_meminfo
from dbwrap_py.bench.smb import Point, grid_lines, measure_with, ratio_text, sweep_summary, table_lines, \
    write_csv
from dbwrap_py.bench.targets import display_name, landed_adapters, split_options
from dbwrap_py.cluster.ctdb import CtdbError
from dbwrap_py.cluster.netem import NETEM, NO_DELAY, TCP_DELAY, NetemError, delay_method, profile_named
from dbwrap_py.cluster.netns import NetnsError
from dbwrap_py.cluster.samba_cluster import LOCKING_DATABASES, ClusterError, ClusterSetup, SambaCluster
from dbwrap_py.errors import ConfigError, DbwrapError
from dbwrap_py.nodecache.adapter import node_cache_mode, supports_node_cache
from dbwrap_py.nodecache.cache import WRITE_BACK
from dbwrap_py.options import Options, shown_value
from dbwrap_py.registry import find_adapter
from dbwrap_py.samba import SambaError
from dbwrap_py.servers import ServerError
from dbwrap_py.smbtorture import OWN_FILES_PROCESSES, Rates, own_files, path_contention_unclist
from dbwrap_py.testing.hooks import hooks_for

CTDB = "ctdb"
#: ``--adapters ctdb-sticky``: ctdb with sticky records on LOCKING_DATABASES
#: (``ctdb setdbsticky``; its tunables at their defaults, HopcountMakeSticky
#: 50 and StickyPindown 200 ms), beside plain ctdb, the reference
CTDB_STICKY = "ctdb-sticky"
CTDB_STICKY_LABEL = "ctdb (sticky records)"
NODES = 3
#: as in the seed talks: every node keeps its own open handles' records
NODE_LOCAL_OPENS = ("smbXsrv_open_global.tdb",)
#: the options an adapter runs with here unless -o says otherwise
ADAPTER_DEFAULTS: dict[str, dict[str, str]] = {"fdb": {"fdb_library": "model"}}
#: adapters left out of ``auto``, and why (naming one in --adapters runs it)
NOT_BY_DEFAULT = {
    "scylla": "the cassandra adapter's ScyllaDB dialect: its driver lives in .venv-scylla, "
              "and it would run against Apache Cassandra, as cassandra does",
}
CACHE_SUFFIX = "+cache"
#: a round's warm-up on a fresh cluster: one client, not recorded
WARMUP_SECONDS = 2
#: a cluster's start, warm-up and stop, for the progress bar's ETA
SETUP_SECONDS = 25.0
#: the charts' second title line
SUBTITLE = "one host, {cpus} shared cores: read the ratios to ctdb, not the numbers"
#: what the charts and docs/benchmarks.md say beside the numbers
NOTE = ("{workload}. One host: the {nodes} nodes (ctdbd, smbd), their backend, node agents and smbtorture share "
        "{cpus} CPU cores {over}, so absolute numbers mean little; compare each line with "
        "ctdb, measured in the same run (log scale: equal gaps are equal ratios).")
#: the note's words for the network without --network
LOOPBACK = "over loopback"

START_ERRORS = (ClusterError, CtdbError, NetnsError, NetemError, SambaError, ServerError, DbwrapError,
                 OSError)


@dataclass(frozen=True)
class Configuration:
    """One line of the chart: who keeps smbd's volatile databases."""

    adapter: str | None  # None: ctdb keeps them all (the reference)
    options: Mapping[str, str] = field(default_factory=dict)
    node_local: Sequence[str] = NODE_LOCAL_OPENS
    #: a network profile (ClusterSetup.network); None: loopback addresses, no delay
    network: str | None = None
    #: with adapter None: ctdb with sticky records on the locking databases
    ctdb_sticky: bool = False

    @property
    def label(self) -> str:
        if self.adapter is None:
            return CTDB_STICKY_LABEL if self.ctdb_sticky else CTDB
        name = display_name(self.adapter, self.options)
        mode = node_cache_mode(Options(dict(self.options)))
        if mode is None:
            return name
        return f"{name} + node cache" + ("" if mode == WRITE_BACK else f" ({mode})")

    def setup(self) -> ClusterSetup:
        if self.adapter is None:  # node-local opens here too: the same work on every line
            return ClusterSetup(nodes=NODES, node_local=tuple(self.node_local), network=self.network,
                                ctdb_sticky=LOCKING_DATABASES if self.ctdb_sticky else ())
        return ClusterSetup(nodes=NODES, adapter=self.adapter, databases=LOCKING_DATABASES,
                            adapter_options=dict(self.options), node_local=tuple(self.node_local),
                            network=self.network,
                            agent_metrics=node_cache_mode(Options(dict(self.options))) is not None)

    def describe(self) -> dict:
        network = {"network": self.network} if self.network else {}
        if self.adapter is None:
            sticky = {"sticky": list(LOCKING_DATABASES)} if self.ctdb_sticky else {}
            return {"label": self.label, "volatile databases": "ctdb", "node_local": list(self.node_local),
                    **sticky, **network}
        return {"label": self.label, "adapter": self.adapter, "options": {k: shown_value(k, v) for k, v in self.options.items()},
                "databases": list(LOCKING_DATABASES), "node_local": list(self.node_local), **network}


# -- which configurations ----------------------------------------------------


def _needs_server(name: str) -> bool:
    """Whether the adapter's backend is a server (every node reaches it),
    not files on one host (tdb, sqlite: each node would have its own)."""
    try:
        return hooks_for(name).throwaway_server(ADAPTER_DEFAULTS.get(name, {})) is not None
    except ServerError:
        return True  # a server that cannot run here: it is skipped with its reason
    except DbwrapError:
        return False


def cluster_adapters() -> list[str]:
    """Landed multi-process adapters with a server, less NOT_BY_DEFAULT;
    etcd first (the cluster tests' adapter), then by name."""
    names = [name for name in landed_adapters(multi_process_only=True)
             if name not in NOT_BY_DEFAULT and _needs_server(name)]
    return sorted(names, key=lambda name: (name != "etcd", name))


def left_out() -> dict[str, str]:
    """Landed multi-process adapters ``auto`` does not take, and why."""
    chosen = set(cluster_adapters())
    return {name: NOT_BY_DEFAULT.get(name, "its data are files on one host: each node would have its own")
            for name in landed_adapters(multi_process_only=True) if name not in chosen}


def _with_cache(name: str) -> bool:
    try:
        return supports_node_cache(find_adapter(name))
    except DbwrapError:
        return False


def parse_names(text: str) -> list[str]:
    """``--adapters``: ``auto`` (every cluster adapter, without and with the
    node cache) or a comma list; ``NAME+cache`` is NAME with node_cache=yes;
    ctdb is dropped (it always runs, as the reference); ``ctdb-sticky``
    is ctdb with sticky records, a second reference line."""
    if text.strip() in ("", "auto", "all"):
        return [variant for name in cluster_adapters()
                for variant in (name, name + CACHE_SUFFIX)[:2 if _with_cache(name) else 1]]
    return [n.strip() for n in text.split(",") if n.strip() and n.strip() != CTDB]


def configurations(text: str, pairs: Sequence[str], node_local: Sequence[str] = NODE_LOCAL_OPENS,
                   network: str | None = None) -> list[Configuration]:
    """ctdb first, then each named adapter with its options (``-o K=V`` for
    all, ``-o ADAPTER:K=V`` for one); repeats (by label) dropped. Every
    one runs on ``network`` (a profile's name)."""
    names = parse_names(text)
    bases = list(dict.fromkeys(name.removesuffix(CACHE_SUFFIX) for name in names))
    given = split_options(pairs, bases)
    chosen = {CTDB: Configuration(None, node_local=tuple(node_local), network=network)}
    for name in names:
        if name == CTDB_STICKY:
            sticky = Configuration(None, node_local=tuple(node_local), network=network, ctdb_sticky=True)
            chosen.setdefault(sticky.label, sticky)
            continue
        base = name.removesuffix(CACHE_SUFFIX)
        options = {**ADAPTER_DEFAULTS.get(base, {}), **given[base]}
        if name.endswith(CACHE_SUFFIX):
            options.setdefault("node_cache", "yes")
        config = Configuration(base, options, tuple(node_local), network)
        chosen.setdefault(config.label, config)
    return list(chosen.values())


def round_order(configs: Sequence[Configuration], round_index: int) -> list[Configuration]:
    """As given in even rounds, reversed in odd ones: a drift during a round
    then weighs on the first and the last configurations alike."""
    return list(configs) if round_index % 2 == 0 else list(reversed(configs))


#: ``--network loopback``: no profile, the nodes on loopback addresses (the default)
NO_PROFILE = "loopback"


def network_named(text: str | None) -> str | None:
    """``--network``'s profile name; None for ``loopback`` or none given."""
    return None if text in (None, "", NO_PROFILE) else text


def network_settings(name: str | None) -> dict[str, object]:
    """``--network``: the profile's settings for the results, refused with
    the known profiles when unknown, or when netem cannot delay here."""
    if name is None:
        return {}
    try:
        profile = profile_named(name)
    except NetemError as exc:
        raise ConfigError(f"--network: {exc}") from exc
    try:
        method = delay_method(profile)
    except NetemError as exc:
        raise ConfigError(f"--network {name}: {exc}") from exc
    far = {"far_nodes": sorted(profile.far_nodes), "far_one_way_delay_ms": profile.far_delay_ms,
           "far_jitter_ms": profile.far_jitter_ms} if profile.far_nodes else {}
    return {"network": {"profile": profile.name, "method": method, "one_way_delay_ms": profile.delay_ms,
                        "jitter_ms": profile.jitter_ms, **far, "about": profile.about,
                        "delayed": DELAYED[method]}}


def one_way_text(network: Mapping[str, object]) -> str:
    """network_settings' delays in words: "0.1 ms one way; node 2 15 ms
    from every other site"."""
    text = f"{network['one_way_delay_ms']:g} ms one way"
    far = [str(node) for node in network.get("far_nodes") or ()]
    if far:
        text += (f"; node{'s' if len(far) > 1 else ''} {', '.join(far)} "
                 f"{network['far_one_way_delay_ms']:g} ms from every other site")
    return text


#: what each method delays, for the results and the printed header
DELAYED = {
    NETEM: "every packet a node or this host's namespace (backend server, smbtorture) sends to "
           "another of them",
    TCP_DELAY: "both ways of every TCP connection a node makes to another node or to this host's "
               "namespace (ctdb, smbd and node agents to the backend); not smbtorture's to smbd",
    NO_DELAY: "nothing",
}


# -- the run -------------------------------------------------------------------


@dataclass
class Results:
    points: list[Point] = field(default_factory=list)
    #: configuration label -> its stop at the fewest clients (none larger measured after it)
    stops: dict[str, Stop] = field(default_factory=dict)
    #: clusters that did not start or warm up: (label, round, why)
    not_started: list[tuple[str, int, str]] = field(default_factory=list)
    #: Ctrl-C ended the run early: what was measured is kept
    interrupted: bool = False

    def stop(self, label: str, stop: Stop) -> None:
        """Keep ``stop`` unless ``label`` already stops at fewer clients."""
        if label not in self.stops or stop.nprocs < self.stops[label].nprocs:
            self.stops[label] = stop


@dataclass
class Events:
    """What the caller shows: a point starts, one is measured, one is
    skipped, a cluster is up (or not)."""

    start: Callable[[str, int], None] = lambda *_: None
    point: Callable[[Point], None] = lambda _: None
    skip: Callable[[str, int, str], None] = lambda *_: None
    set_up: Callable[[str, int, str], None] = lambda *_: None


#: the workloads (--workload): every client on one path, or each on its own file
SHARED, OWN_FILES = "shared", "own-files"
WORKLOADS = {
    SHARED: "smb2.bench.path-contention-shared, clients spread over the nodes (--unclist): one hot record",
    OWN_FILES: "smb2.bench.path-contention-shared on a file per client (one smbtorture per client up to "
               f"{OWN_FILES_PROCESSES}, then that many, each on one node and file): cold records",
}


class Sweep:
    """Every configuration at every client count, ``rounds`` times."""

    def __init__(self, configs: Sequence[Configuration], nprocs: Sequence[int], seconds: int,
                 rounds: int, events: Events | None = None,
                 meminfo: Callable[[], str] = read_meminfo, workload: str = SHARED) -> None:
        if workload not in WORKLOADS:
            raise ConfigError(f"--workload {workload}: not one of {', '.join(WORKLOADS)}")
        self.workload = workload
        self.configs, self.nprocs, self.seconds, self.rounds = list(configs), sorted(nprocs), seconds, rounds
        self.events = events or Events()
        self.meminfo = meminfo
        self.guards = {c.label: MemoryGuard.for_machine(meminfo()) for c in self.configs}
        self.results = Results()

    def run(self) -> Results:
        """The results; Ctrl-C ends the run with what it has (the running
        cluster stops on the way out)."""
        try:
            for round_index in range(self.rounds):
                for config in round_order(self.configs, round_index):
                    self._one_cluster(config, round_index)
        except KeyboardInterrupt:
            self.results.interrupted = True
        return self.results

    def _one_cluster(self, config: Configuration, round_index: int) -> None:
        """A fresh cluster for ``config``, a warm-up, then every client count."""
        label = config.label
        started, left = False, list(self.nprocs)
        try:
            with SambaCluster(config.setup()) as cluster:
                warm = path_contention_unclist(cluster.sambas, cluster.root, 1, WARMUP_SECONDS)
                if not warm.ok:
                    raise ClusterError("the warm-up (1 client) failed: " + "; ".join(warm.cause[:3]))
                started = True
                self.events.set_up(label, round_index, "")
                self._points(config, cluster, round_index, left)
        except START_ERRORS as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if started:
                why = "failed during the round: " + why
            else:
                self.events.set_up(label, round_index, why)
            self.results.not_started.append((label, round_index, why))
            for n in left:
                self.events.skip(label, n, "its cluster did not start" if not started else why)

    def _points(self, config: Configuration, cluster: SambaCluster, round_index: int,
                left: list[int]) -> None:
        """Each client count in ``left``, removed from it once done."""
        label = config.label
        counters = _counters(config, cluster)
        while left:
            n = left.pop(0)
            skip = self.reason_to_skip(label, n, round_index)
            if skip:
                self.events.skip(label, n, skip)
                continue
            self.events.start(label, n)
            with MemoryWatch(read=self.meminfo) as watch:
                point, rates = measure_with(lambda on_running: self._workload(cluster, n, on_running), label, n,
                                            round_index, counters)
            self.guards[label].learn(n, watch.used_kib)
            self.results.points.append(point)
            self.events.point(point)
            if not point.ok:
                kind, why = failure(rates, n)
                self.results.stop(label, Stop(n, round_index, kind, why, point.failure_lines()))

    def _workload(self, cluster: SambaCluster, n: int, on_running: Callable[[], None]) -> Rates:
        """One point's smbtorture; ``on_running`` once its clients are all
        connected (path-contention-shared; own-files runs several
        smbtortures, and its readings include their connects)."""
        if self.workload == OWN_FILES:
            return own_files(cluster.sambas, cluster.root, n, self.seconds)
        return path_contention_unclist(cluster.sambas, cluster.root, n, self.seconds, on_running)

    def reason_to_skip(self, label: str, nprocs: int, round_index: int) -> str:
        """Why ``label`` is not measured at ``nprocs`` now, or ''."""
        stop = self.results.stops.get(label)
        if stop is not None and nprocs > stop.nprocs:
            return f"stopped at {stop.nprocs} clients ({stop.kind})"
        refusal = self.guards[label].refusal(nprocs, mem_available_kib(self.meminfo()))
        if refusal is None:
            return ""
        self.results.stop(label, Stop(nprocs, round_index, MEMORY, refusal))
        return refusal


#: the node agents' metrics a point records (summed over the nodes; per open):
#: ownership moving between nodes, and the node leases' renewals
AGENT_COUNTERS = ("release_requests_served_total", "records_handed_back_total", "lease_renewals_total",
                  "lease_renewal_failures_total", "lease_regrants_total", "lease_renewal_seconds_sum",
                  "release_request_seconds_sum")


def _counters(config: Configuration, cluster: SambaCluster) -> Callable[[], dict[str, float]]:
    """What a point records per open, read before and after it: the
    backend's request counters (none for ctdb), the node agents' metrics
    (AGENT_COUNTERS, "agent " before each) and the CPU milliseconds of the
    cluster's processes by command ("cpu ms " before each: smbd, ctdbd,
    the agents, the backend's server)."""
    hooks = hooks_for(config.adapter) if config.adapter is not None else None
    reach = dict(cluster.backend_options)

    def counters() -> dict[str, float]:
        found: dict[str, float] = {}
        try:  # by-products: never fail a point for them
            found.update(hooks.store_counters(reach) if hooks is not None else {})
        except Exception:
            pass
        try:
            agents = cluster.agent_counters()
            found.update({f"agent {name}": agents[name] for name in AGENT_COUNTERS if name in agents})
        except Exception:
            pass
        found.update({f"cpu ms {name}": round(seconds * 1000) for name, seconds in cluster.cpu_seconds().items()})
        return found

    return counters


# -- the results ---------------------------------------------------------------


def summary(results: Results) -> list[dict]:
    """sweep_summary's rows against ctdb, and for the client counts a
    configuration was not measured at, why (``missing``); where points
    have opens/s per node (own-files), each row has ``per_node``: each
    node's median over the rounds."""
    rows = sweep_summary(results.points, reference=CTDB)
    tried = {(p.nprocs, p.mode) for p in results.points}
    by_node = any(p.per_node for p in results.points)
    for row in rows:
        stop = results.stops.get(row["backend"])
        if by_node:
            row["per_node"] = per_node_medians([p for p in results.points if p.ok and p.mode == row["backend"]
                                                and p.nprocs == row["nprocs"]])
        row["missing"] = ""
        if row["samples"]:
            continue
        if stop is not None and row["nprocs"] >= stop.nprocs:
            row["missing"] = stop.kind if row["nprocs"] == stop.nprocs else "stopped"
        elif (row["nprocs"], row["backend"]) not in tried:
            row["missing"] = "not run"  # its cluster did not start
    return rows


def per_node_medians(points: Sequence[Point]) -> dict[int, float]:
    """Each node's opens/s, the median over ``points`` that have it."""
    nodes = sorted({node for p in points for node in p.per_node})
    return {node: round(statistics.median(p.per_node[node] for p in points if node in p.per_node), 1)
            for node in nodes}


def _per_node_cell(row: Mapping | None) -> str:
    if row is None:
        return "-"
    if not row["samples"]:
        return row.get("missing") or "failed"
    per_node = row.get("per_node") or {}
    return " / ".join(f"{per_node[n]:.0f}" if n in per_node else "-" for n in range(NODES))


def per_node_table_lines(rows: Sequence[Mapping]) -> list[str]:
    """Each configuration's opens/s per node at each client count (node 0
    / node 1 / node 2; '-' for a node without clients), the median over
    rounds; none where no row has them."""
    if not any(r.get("per_node") for r in rows):
        return []
    labels = list(dict.fromkeys(r["backend"] for r in rows))
    return ["", "opens/s per node (" + " / ".join(f"node {n}" for n in range(NODES)) + "): median over rounds",
            *grid_lines(rows, labels, _per_node_cell, min_width=20)]


def _ratio_cell(row: Mapping | None) -> str:
    if row is None:
        return "-"
    if not row["samples"]:
        return row.get("missing") or "failed"
    if not row.get("ratio"):
        return "no ctdb"
    if row["ratio_min"] == row["ratio_max"]:
        return ratio_text(row["ratio"])
    return f"{ratio_text(row['ratio'])} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"


def ratio_table_lines(rows: Sequence[Mapping]) -> list[str]:
    """Each configuration's opens/s over ctdb's at each client count, the
    median over rounds (and the rounds' range)."""
    labels = [label for label in dict.fromkeys(r["backend"] for r in rows) if label != CTDB]
    return grid_lines(rows, labels, _ratio_cell, min_width=18)


def report_lines(rows: Sequence[Mapping], results: Results) -> list[str]:
    """What the run prints at its end: opens/s with the ratio to ctdb, the
    ratio table, then each stop and each cluster that did not start."""
    lines = ["opens/s (ratio to ctdb, the same run)", *table_lines(rows, CTDB), "",
             "ratio to ctdb: median over rounds (range)", *ratio_table_lines(rows), *per_node_table_lines(rows)]
    lines += [stop.line(label) for label, stop in results.stops.items()]
    lines += [f"{label}: no measurement in round {r + 1}: {why}" for label, r, why in results.not_started]
    if results.interrupted:
        lines.append("interrupted (Ctrl-C): the results hold what was measured before")
    return lines


def legend_names(results: Results) -> dict[str, str]:
    """Chart labels that say where a line stops."""
    return {label: f"{label} (stops at {stop.nprocs}: {stop.kind})" for label, stop in results.stops.items()}


def over(network: Mapping[str, object] | None) -> str:
    """How the nodes reach each other, in the note's words: loopback, or
    the --network profile (network_settings) with its delay and method."""
    if not network:
        return LOOPBACK
    return (f"on the '{network['profile']}' network profile ({one_way_text(network)}, "
            f"{network['method']}: delays {network['delayed']})")


def note(cpus: int | None = None, network: Mapping[str, object] | None = None, workload: str = SHARED) -> str:
    return NOTE.format(nodes=NODES, cpus=cpus or os.cpu_count(), over=over(network), workload=WORKLOADS[workload])


def write_json(path: Path, results: Results, rows: Sequence[Mapping], configs: Sequence[Configuration],
               settings: Mapping[str, object]) -> None:
    meminfo = read_meminfo()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": WORKLOADS[str(settings.get("workload", SHARED))],
        "cluster": f"{NODES} nodes on one host (ctdbd and smbd per node, "
                   f"{'network namespaces' if settings.get('network') else 'loopback addresses'})",
        "reference": CTDB,
        "note": note(network=settings.get("network"), workload=str(settings.get("workload", SHARED))),
        **settings,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "memory_mib": mem_total_kib(meminfo) // 1024},
        "configurations": [c.describe() for c in configs],
        "stops": {label: asdict(stop) for label, stop in results.stops.items()},
        "not_started": [{"configuration": label, "round": r + 1, "why": why}
                        for label, r, why in results.not_started],
        "interrupted": results.interrupted,
        "points": [asdict(p) for p in results.points],
        "summary": list(rows),
    }, indent=2) + "\n")


def write_results(out: Path, results: Results, rows: Sequence[Mapping],
                  configs: Sequence[Configuration], settings: Mapping[str, object]) -> list[Path]:
    """``out`` (JSON), and beside it the points (.csv), the summary
    (-summary.csv) and the charts (-ops.png, -latency.png); their paths."""
    stem = out.with_suffix("")
    write_json(out, results, rows, configs, settings)
    files = [out, stem.with_suffix(".csv"), stem.with_name(stem.name + "-summary.csv")]
    write_csv(files[1], [asdict(p) for p in results.points])
    write_csv(files[2], rows)
    network, workload = settings.get("network"), str(settings.get("workload", SHARED))
    return files + (charts(rows, stem, results, network, workload) if results.points else [])


def charts(rows: Sequence[Mapping], stem: Path, results: Results,
           network: Mapping[str, object] | None = None, workload: str = SHARED) -> list[Path]:
    """<stem>-ops.png and <stem>-latency.png: a line per configuration,
    ctdb the reference, the note under the axes, stops in the legend."""
    from dbwrap_py.bench.charts import cluster_charts

    subtitle = SUBTITLE.format(cpus=os.cpu_count())
    if network:
        subtitle += f"; '{network['profile']}' network, {one_way_text(network)}"
    if workload != SHARED:
        subtitle += f"; workload {workload}"
    return cluster_charts(rows, stem, NODES, CTDB, subtitle, note(network=network, workload=workload),
                          legend_names(results))
