"""`make bench-ca-cluster`: persistent handles on a three-node Samba 4.25
cluster, ctdb against replicated backends in one run.

Per configuration, one SambaCluster (cluster/samba_cluster.py,
``persistent_handle_setup``): ctdb keeping every database, which pushes each
persistent record to every node; or smbXsrv_open_global, locking.tdb and
brlock.tdb on etcd, rados or cassandra through a write-back node cache,
which writes each persistent record through to the backend before the
store returns. Two measures:

* opens/s on the continuously available share at 1, 4, 16 and 64 clients,
  client i on node i mod 3; each opens a file of its own with a persistent
  handle and closes it, for ``seconds`` (bench/ca.py's client);
* the bytes a persistent open costs the store: one client holds ``held``
  persistent handles open on node 1, and the store is summed before and
  while they are held. ctdb: the keys and values of the three databases and
  their ``_persistent`` copies in every node's local copy (``ctdb cattdb``
  on each node; its 24-byte record header not counted), so the push to
  every node shows. A backend: everything its store holds
  (bench/store_bytes.py): the records written through, their copies
  (c_bridge/per_rec_persistent.c) and the adapter's own keys, once; a
  store of three replicas keeps three times that.

One cluster runs at a time, each configuration in turn, so the ratios to
ctdb are taken in the same run on the same machine; all of it shares this
host's 2 cores with the Python clients, so only the ratios mean something.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dbwrap_py.bench.ca import Point, run_clients
from dbwrap_py.cluster.samba_cluster import PERSISTENT_HANDLE_DATABASES, SambaCluster, persistent_handle_setup

CTDB = "ctdb"
#: persistent handles held open while the store's bytes are summed
HELD = 32
#: ``ctdb cattdb``'s record lines: the key's and the value's sizes
_CATTDB_SIZE = re.compile(r"^(?:key|data)\((\d+)\)", re.MULTILINE)


@dataclass
class Footprint:
    """What ``held`` persistent opens add to the store."""

    configuration: str
    held: int
    bytes_before: int
    bytes_held: int
    #: where the bytes were counted: "every node" (ctdb) or "the store, once"
    counted: str
    #: per database: what the held opens added (bytes)
    added: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def per_open(self) -> float:
        return (self.bytes_held - self.bytes_before) / self.held if self.held else 0.0


def label(backend: str) -> str:
    return CTDB if backend == CTDB else f"{backend}+node-cache"


def measure(cluster: SambaCluster, configuration: str, nprocs: int, seconds: float) -> Point:
    """``nprocs`` clients at once, client i on node i mod 3."""
    return run_clients(configuration, "ca", [samba.setup.address for samba in cluster.sambas], cluster.port,
                       None, nprocs, seconds)


def ctdb_bytes(cluster: SambaCluster) -> dict[str, int]:
    """Keys and values of the persistent-handle databases in every node's
    local copy (ctdb cattdb on each node), per database."""
    found: dict[str, int] = {}
    bases = tuple(name[:-len(".tdb")] for name in PERSISTENT_HANDLE_DATABASES)
    for node in cluster.ctdb.nodes:
        dbmap = node.ctdb("getdbmap")
        for name in sorted(set(re.findall(r"name:(\S+)", dbmap))):
            if name.startswith(bases):
                dump = node.ctdb("cattdb", name, timeout=60)
                found[name] = found.get(name, 0) + sum(int(n) for n in _CATTDB_SIZE.findall(dump))
    return found


def backend_bytes(cluster: SambaCluster) -> dict[str, int]:
    """Everything the backend's store holds (store_bytes.py): the records,
    their copies and the adapter's own keys, once."""
    from dbwrap_py.bench.store_bytes import store_bytes

    assert cluster.setup.adapter is not None
    return {"the store": store_bytes(cluster.setup.adapter, cluster.backend_options)}


def footprint(cluster: SambaCluster, configuration: str, held: int = HELD) -> Footprint:
    """The store's bytes before and while ``held`` persistent handles are open on node 1."""
    from dbwrap_py.testing.smb_client import SmbClient

    count = ctdb_bytes if cluster.setup.adapter is None else backend_bytes
    counted = "every node" if cluster.setup.adapter is None else "the store, once"
    before = count(cluster)
    result = Footprint(configuration, held, sum(before.values()), 0, counted)
    client = SmbClient(cluster.sambas[0].setup.address, cluster.port)
    try:
        handles = [client.open_persistent(f"footprint-{i}.dat", uuid.uuid4()) for i in range(held)]
        granted = sum(h.persistent for h in handles)
        if granted != held:
            result.errors.append(f"{granted} of {held} opens got a persistent handle")
        during = count(cluster)
        result.bytes_held = sum(during.values())
        result.added = {name: during.get(name, 0) - before.get(name, 0) for name in sorted({*before, *during})}
        for h in handles:
            h.close()
    finally:
        client.close()
    return result


def run(backends: Sequence[str], nprocs: Sequence[int], seconds: float, held: int = HELD,
        report: Callable[[str], None] = print) -> tuple[list[Point], list[Footprint]]:
    """ctdb, then each backend with the node cache, one cluster at a time."""
    points: list[Point] = []
    footprints: list[Footprint] = []
    for backend in (CTDB, *backends):
        configuration = label(backend)
        setup = persistent_handle_setup(None if backend == CTDB else backend)
        try:
            with SambaCluster(setup) as cluster:
                for n in nprocs:
                    point = measure(cluster, configuration, n, seconds)
                    points.append(point)
                    report(point_line(point))
                fp = footprint(cluster, configuration, held)
                footprints.append(fp)
                report(footprint_line(fp))
        except Exception as exc:  # the configuration's cause, and the others still run
            why = f"{type(exc).__name__}: {exc}"
            points.append(Point(configuration, "ca", 0, 0.0, errors=[f"the cluster failed: {why}"]))
            report(f"  {configuration}: the cluster failed: {why}")
    return points, footprints


def point_line(p: Point) -> str:
    why = f"  ({p.errors[0]}{' ...' if len(p.errors) > 1 else ''})" if p.errors else ""
    return (f"  {p.backend:<22} clients={p.nprocs:<3} {p.opens_per_second:8.1f} opens/s"
            f"  persistent {p.persistent}/{p.opens}{why}")


def footprint_line(f: Footprint) -> str:
    why = f"  ({'; '.join(f.errors)})" if f.errors else ""
    each = ", ".join(f"{name} {added / f.held:.0f}" for name, added in f.added.items() if added)
    return (f"  {f.configuration:<22} {f.held} persistent opens held: {f.bytes_before} -> {f.bytes_held}"
            f" bytes ({f.counted}), {f.per_open:.0f} bytes per open ({each}){why}")


def table(points: Sequence[Point], footprints: Sequence[Footprint]) -> list[str]:
    """opens/s per configuration and client count, with the ratio to ctdb's
    at the same count; then the bytes per open."""
    by = {(p.backend, p.nprocs): p for p in points if p.nprocs}
    configurations = list(dict.fromkeys(p.backend for p in points))
    counts = sorted({p.nprocs for p in points if p.nprocs})
    lines = [f"{'configuration':<22} " + " ".join(f"{f'{n} clients':>18}" for n in counts)]
    for c in configurations:
        cells = []
        for n in counts:
            p, ref = by.get((c, n)), by.get((CTDB, n))
            if p is None or p.errors or not p.opens:
                cells.append(f"{'failed' if p is not None else '-':>18}")
                continue
            ratio = f" ({p.opens_per_second / ref.opens_per_second:.2f}x)" if ref and ref.opens_per_second else ""
            cells.append(f"{f'{p.opens_per_second:.1f}{ratio}':>18}")
        lines.append(f"{c:<22} " + " ".join(cells))
    lines.append("")
    lines.append(f"{'configuration':<22} {'bytes per persistent open':>26}  counted in")
    for f in footprints:
        lines.append(f"{f.configuration:<22} {f.per_open:>26.0f}  {f.counted}")
    return lines
