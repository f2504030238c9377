"""dbwrap-py: look at adapters and databases from the command line.

  dbwrap-py adapters                       built-in adapters and what they declare
  dbwrap-py dump ADAPTER DB [-o k=v ...]   every record, like tdbdump
  dbwrap-py get ADAPTER DB KEY             one value
  dbwrap-py put ADAPTER DB KEY VALUE       store under the record lock
  dbwrap-py check ADAPTER [-o k=v ...]     conformance suite: is Samba safe on it?
  dbwrap-py copy --from A [-o k=v] --to B [-o k=v] DB...
                                           copy persistent databases between backends, verified
  dbwrap-py samba [--bridge DB,...]        a throwaway smbd on 127.0.0.1 until Ctrl-C
  dbwrap-py cluster [--nodes 3] [--adapter A --databases locking|volatile|DB,...] [-o k=v ...]
                                           a Samba cluster (ctdbd and smbd per node) until Ctrl-C
  dbwrap-py server ADAPTER [-o k=v ...]    the adapter's throwaway server on 127.0.0.1 until Ctrl-C
  dbwrap-py ceph [--osds 1|3] [--auth cephx] a throwaway Ceph for the rados adapter until Ctrl-C
  dbwrap-py cassandra [--nodes 1|3] [--paxos-variant v1|v2] [--auth none|password]
                                           a throwaway Cassandra for the cassandra adapter until Ctrl-C
  dbwrap-py zookeeper [--nodes 1|3]        a throwaway ZooKeeper for the zookeeper adapter until Ctrl-C
  dbwrap-py node-agent --adapter A --cache-dir D ...   the node agent (node_cache = yes), until SIGTERM
  dbwrap-py proxy-daemon --socket PATH [--config F [--group G]]  proxy mode's node daemon, until SIGTERM
  dbwrap-py status --cache-dir D           this node's view: the node agent's lease and its metrics
  dbwrap-py torture [--suite S ...]        smbtorture suites, native against the bridge
  dbwrap-py demo                           smbd on the bridge, opens/s against native tdb
  dbwrap-py soak [--adapter A] [--points N]  node cache: path-contention points until one fails
  dbwrap-py bench smb [--adapters A,...]   path-contention-shared sweep, every adapter against native tdb
  dbwrap-py bench cluster [--adapters A,...]  path-contention-shared on a 3-node cluster, against ctdb
  dbwrap-py bench elastic [--events kill,leave,join]  opens/s per second while a node dies, leaves or joins
  dbwrap-py bench micro                    per-operation p50/p99 through the bridge, YCSB-style mixes
  dbwrap-py bench memory                   RSS and PSS per smbd client process, native against bridged
  dbwrap-py bench instructions             instructions per dbwrap call (callgrind), native against bridged

DB is the name smbd would pass to db_open, e.g. /var/lib/samba/private/secrets.tdb.
Keys and values are given as text; use \\xNN escapes for other bytes.
"""

from __future__ import annotations

import argparse
import codecs
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.database import Database, open_database
from dbwrap_py.errors import DbwrapError
from dbwrap_py.ntstatus import NAMES
from dbwrap_py.options import shown_options, shown_value
from dbwrap_py.registry import adapter_names, find_adapter
from dbwrap_py.servers import backend_options, serve_until_stopped

if TYPE_CHECKING:
    from dbwrap_py import migrate
    from dbwrap_py.conformance import SuiteRun
    from dbwrap_py.samba import SambaSetup
    from dbwrap_py.smbtorture import Comparison


def _bytes(text: str) -> bytes:
    return codecs.escape_decode(text.encode())[0]


def _show(data: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 and b != 0x5C else f"\\x{b:02x}" for b in data)


def _open(args: argparse.Namespace) -> Database:
    flags = TDB_CLEAR_IF_FIRST if args.volatile else 0
    return open_database(
        args.db, 0, flags, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, args.adapter, args.option
    )


def _cmd_adapters(args: argparse.Namespace) -> int:
    for name in adapter_names():
        try:
            cls = find_adapter(name)
            caps = cls.capabilities
        except DbwrapError as exc:
            print(f"{name:12} unavailable: {exc}")
            continue
        print(
            f"{name:12} transactions={'yes' if caps.transactions else 'no'}"
            f" multi_process={'yes' if caps.multi_process else 'no'}"
            f" lock_release={caps.lock_release_seconds:g}s"
        )
        for note in caps.notes:
            print(f"{'':12} note: {note}")
        for option in cls.options_schema if args.options else ():
            print(f"{'':12} option {option.describe()}")
    return 0


def _cmd_dump(args: argparse.Namespace) -> int:
    db = _open(args)
    try:
        count = 0
        for key, value in db.traverse(False):
            print(f"key({len(key)}) = \"{_show(key)}\"\ndata({len(value)}) = \"{_show(value)}\"\n")
            count += 1
        print(f"{count} records", file=sys.stderr)
    finally:
        db.close()
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    db = _open(args)
    try:
        value = db.fetch(_bytes(args.key))
    finally:
        db.close()
    if value is None:
        print("not found", file=sys.stderr)
        return 1
    print(_show(value))
    return 0


def _cmd_put(args: argparse.Namespace) -> int:
    db = _open(args)
    key = _bytes(args.key)
    try:
        db.lock(key)
        try:
            db.store(key, _bytes(args.value), 0)
        finally:
            db.unlock(key)
    finally:
        db.close()
    return 0


def _adapter_options(pairs: Sequence[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def _cmd_check(args: argparse.Namespace) -> int:
    import json

    from dbwrap_py.conformance import run_suite, run_suites

    adapter = None if args.adapter == "native" else args.adapter
    options = _adapter_options(args.option)
    variants = [_adapter_options(variant.split()) for variant in args.variant or ()]
    if variants and adapter is None:
        print("dbwrap-py check: --variant needs an adapter (native tdb has no options)", file=sys.stderr)
        return 2
    only, pythonpath = args.only or (), args.pythonpath or ()
    runs = (run_suites(adapter, options, variants, only=only, pythonpath=pythonpath) if variants
            else [run_suite(adapter, options, only=only, pythonpath=pythonpath)])
    for index, run in enumerate(runs):
        if variants:
            added = shown_options(variants[index - 1]) if index else "none"
            print(f"{chr(10) if index else ''}== table {index + 1} of {len(runs)}, options added: {added}")
        _show_check(run, args.verbose)
    if args.json:
        found = [{"target": run.target, "results": [r.__dict__ for r in run.results]} for run in runs]
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(found if variants else found[0], indent=1))
    return 0 if all(run.ok for run in runs) else 1


def _show_check(run: "SuiteRun", verbose: bool) -> None:
    from dbwrap_py.conformance.report import print_table

    print_table(run, sys.stdout)
    if verbose and run.log:
        print("\nbridge log:\n" + run.log, end="")
    elif run.results and not run.names("pass") and run.log.strip():
        # nothing passed: the likely cause is one the bridge logged (-v shows all)
        print("cause (the bridge's first log lines):", *run.log.strip().splitlines()[:3], sep="\n  ")


def _cmd_copy(args: argparse.Namespace) -> int:
    from dbwrap_py import migrate

    if args.source is None or args.destination is None:
        print("dbwrap-py copy: give both --from ADAPTER and --to ADAPTER", file=sys.stderr)
        return 2
    names = list(args.db)
    try:
        if args.persistent:
            if not args.configfile:
                raise migrate.CopyRefused("--persistent needs --configfile: the Samba's smb.conf")
            names += migrate.persistent_databases(args.configfile)
        if not names:
            raise migrate.CopyRefused("no database named: give paths, or --persistent --configfile F")
        if not args.while_running:
            _refuse_if_samba_runs(args.configfile, names)
    except migrate.CopyRefused as exc:
        print(f"dbwrap-py copy: refused: {exc}", file=sys.stderr)
        return 2
    source = migrate.Endpoint(args.source, tuple(args.from_options))
    destination = migrate.Endpoint(args.destination, tuple(args.to_options))
    print(f"copy from {source} to {destination}")
    status = 0
    for name in names:
        try:
            report = migrate.copy_database(name, source, destination, args.overwrite)
        except migrate.CopyRefused as exc:
            print(f"  refused: {exc}")
            status = max(status, 2)
            continue
        except DbwrapError as exc:
            print(f"  {name}: failed: {type(exc).__name__}: {exc}"
                  + ("" if args.source == args.destination else
                     " (a transactional destination is left as it was)"))
            status = max(status, 2)
            continue
        status = max(status, _show_copy(report))
    return status


def _refuse_if_samba_runs(configfile: str | None, names: Sequence[str]) -> None:
    from dbwrap_py import migrate

    busy = migrate.running_daemons(configfile) if configfile else []
    busy += migrate.processes_holding(names)
    if busy:
        raise migrate.CopyRefused(
            "Samba is using these databases: " + "; ".join(busy) + ". Stop smbd, winbindd and"
            " nmbd first: what they write after the copy would be lost. --while-running copies"
            " anyway.")


def _show_copy(report: "migrate.CopyReport") -> int:
    if report.empty_source:
        print(f"  {report.name}: the source has no records; nothing written"
              " (is this the path smbd uses?)")
        return 0
    how = "in one transaction" if report.transactional else "record by record"
    replaced = f", replacing {report.overwritten}" if report.overwritten else ""
    print(f"  {report.name}: {report.copied} records copied {how}{replaced};"
          f" {report.verified} verified")
    for what, keys in (("differs", report.differing), ("missing", report.missing),
                       ("only in the destination", report.extra)):
        for key in keys[:5]:
            print(f"    {what}: {_show(key)}")
        if len(keys) > 5:
            print(f"    ... and {len(keys) - 5} more {what}")
    return 0 if report.ok else 1


def _cmd_samba(args: argparse.Namespace) -> int:
    from dbwrap_py.samba import VOLATILE_DATABASES, SambaSetup

    bridged = VOLATILE_DATABASES if args.bridge == "volatile" else \
        tuple(d for d in args.bridge.split(",") if d)
    with backend_options(args.adapter, _adapter_options(args.option)) as options:
        return _serve_samba(SambaSetup(bridged=bridged, adapter=args.adapter,
                                       adapter_options=options, port=args.port), bridged)


def _serve_samba(setup: "SambaSetup", bridged: Sequence[str]) -> int:
    from dbwrap_py.samba import ThrowawaySamba

    def banner(samba: "ThrowawaySamba") -> str:
        return (f"smbd pid {samba.pid} on 127.0.0.1:{samba.port}\n"
                f"  share {samba.unc}, user {samba.credentials}\n"
                f"  smb.conf {samba.conf}\n  log {samba.log}\n"
                f"  bridged: {', '.join(bridged) or 'nothing (native tdb)'}\n"
                f"  in {samba.root}")

    serve_until_stopped(ThrowawaySamba(setup), banner)
    return 0


def _cmd_cluster(args: argparse.Namespace) -> int:
    """A throwaway Samba cluster until SIGTERM or Ctrl-C; prints its nodes."""
    from dbwrap_py.cluster.ctdb import CtdbError
    from dbwrap_py.cluster.samba_cluster import (LOCKING_DATABASES, ClusterError, ClusterSetup,
                                                 SambaCluster)
    from dbwrap_py.samba import VOLATILE_DATABASES, SambaError

    named = {"locking": LOCKING_DATABASES, "volatile": VOLATILE_DATABASES, "": ()}
    databases = named.get(args.databases, tuple(d for d in args.databases.split(",") if d))
    if args.adapter and not databases:
        databases = LOCKING_DATABASES
    setup = ClusterSetup(nodes=args.nodes, adapter=args.adapter or None,
                         databases=databases if args.adapter else (),
                         adapter_options=_adapter_options(args.option),
                         node_local=tuple(d for d in args.node_local.split(",") if d))

    def banner(cluster: SambaCluster) -> str:
        where = (f"{args.adapter} for {', '.join(setup.databases)}" if args.adapter
                 else "ctdb for every volatile database")
        nodes = "\n".join(f"  node {n}: {samba.unc} -p {samba.port} (smbd pid {samba.pid}, "
                          f"ctdbd pid {cluster.ctdb.nodes[n].process.pid})"  # type: ignore[union-attr]
                          for n, samba in enumerate(cluster.sambas))
        return (f"{args.nodes}-node Samba cluster, {where}\n{nodes}\n"
                f"  user {cluster.sambas[0].credentials}; unclist: {' '.join(cluster.uncs)}\n"
                f"  ctdb: CTDB_TEST_MODE=yes CTDB_BASE={cluster.ctdb.nodes[0].base} ctdb status\n"
                f"  in {cluster.root}")

    try:
        serve_until_stopped(SambaCluster(setup), banner)
    except (ClusterError, CtdbError, SambaError) as exc:  # the daemons' log tails say why
        print(f"dbwrap-py cluster: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_torture(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from dbwrap_py import smbtorture

    try:
        configurations = torture_configurations(args.config + args.config_short + args.config_brief,
                                                args.adapter, args.option)
    except ValueError as exc:
        print(f"dbwrap-py torture: {exc}", file=sys.stderr)
        return 2
    with ExitStack() as stack:  # each configuration's throwaway servers, stopped on the way out
        setups = [smbtorture.setup_for("bridge", adapter, stack.enter_context(backend_options(adapter, options)),
                                       persistent_handles=args.persistent_handles)
                  for adapter, options in configurations]
        left_out = torture_left_out(len(setups) - len(args.config_short) - len(args.config_brief),
                                    len(args.config_short), len(args.config_brief))
        return _compare_torture(args, setups, left_out)


def torture_left_out(full: int, short: int, brief: int) -> list[tuple[str, ...]]:
    """The suites each configuration leaves out, in torture_configurations'
    order: --config (or --adapter), then --config-short, then --config-brief."""
    from dbwrap_py import smbtorture

    return [()] * full + [smbtorture.LONG_SUITES] * short + [smbtorture.BRIEF_SUITES] * brief


def torture_configurations(configs: Sequence[str], adapter: str,
                           pairs: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """``--config ADAPTER[,K=V...]`` (repeatable), or else ``--adapter`` with ``-o``."""
    if not configs:
        return [(adapter, _adapter_options(pairs))]
    if pairs or adapter != "tdb":
        raise ValueError("give --config, or --adapter and -o, not both")
    parsed = []
    for text in configs:
        name, *rest = [part.strip() for part in text.split(",")]
        if not name or any("=" not in pair for pair in rest):
            raise ValueError(f"--config {text!r}: expected ADAPTER[,K=V...]")
        parsed.append((name, _adapter_options(rest)))
    return parsed


def _compare_torture(args: argparse.Namespace, setups: Sequence["SambaSetup"],
                     left_out: Sequence[Sequence[str]]) -> int:
    from dbwrap_py import smbtorture
    from dbwrap_py.bench.targets import display_name

    suites = args.suite or list(smbtorture.PERSISTENT_SUITES if args.persistent_handles
                                else smbtorture.SUITES)
    # fdb (model) says so; a column per setup, named in the legend
    names = [_torture_name(display_name(s.adapter, s.adapter_options), s.adapter_options) for s in setups]
    skipped = [[suite for suite in suites if suite in skip] for skip in left_out]
    shown = [name + (f" (leaves out {', '.join(gone)})" if gone else "") for name, gone in zip(names, skipped)]
    labels = names if len(setups) == 1 else [f"[{n}]" for n in range(1, len(setups) + 1)]
    if len(setups) > 1:
        print(*(f"{label} {name}" for label, name in zip(labels, shown)), sep="\n")
    print(f"{len(suites)} suites, {args.parallel} smbtorture runs at a time; "
          "* failed once through the bridge and passed on retry, ! a regression", flush=True)

    def show(row: list[smbtorture.Comparison]) -> None:
        print("\n" + "\n".join(smbtorture.suite_table(row, labels)), flush=True)

    native = smbtorture.setup_for("native", persistent_handles=args.persistent_handles)
    rows = smbtorture.compare_matrix(suites, setups, parallel=args.parallel, progress=show,
                                     native_setup=native, left_out=left_out)
    failed = False
    print()
    for column, (label, name) in enumerate(zip(labels, shown)):
        comparisons = [row[column] for row in rows]
        failed |= _torture_summary(label if len(setups) > 1 else "", name, comparisons)
    for name, why in smbtorture.EXCLUDED.items():
        print(f"excluded: {name}: {why}")
    for row in rows:
        if not row[0].native.results:  # nothing to compare against
            failed = True
            print(f"NOT COMPARED: {row[0].suite}: the native run gave no results",
                  *row[0].native.cause, sep="\n      ")
    return 1 if failed else 0


#: the options a torture result's name shows (endpoints and sockets say nothing)
_SHOWN_OPTIONS = ("node_cache", "proxy_fastpath", "lease_ttl", "lease")


def _torture_name(label: str, options: Mapping[str, str]) -> str:
    shown = " ".join(f"{k}={v}" for k, v in options.items() if k in _SHOWN_OPTIONS)
    return f"bridge+{label} {shown}".rstrip()


def _torture_summary(label: str, name: str, comparisons: Sequence["Comparison"]) -> bool:
    """One setup's totals, over the suites it ran; True when it has a regression."""
    comparisons = [c for c in comparisons if not c.left_out]
    native_ok = sum(r == "success" for c in comparisons for r in c.native.results.values())
    bridge_ok = sum(r == "success" for c in comparisons for r in c.bridge.results.values())
    regressions = [f"{c.suite}.{n}" for c in comparisons for n in c.regressions]
    flaky = [f"{c.suite}.{n}" for c in comparisons for n in c.flaky]
    print(f"{label} {name}: {bridge_ok} subtests passing (native {native_ok}); "
          f"{native_ok - len(regressions)} passed, {len(regressions)} failed".lstrip())
    if flaky:
        print("    failed once through the bridge, passed on retry: " + ", ".join(flaky))
    if regressions:
        print("    REGRESSIONS (pass natively, fail through the bridge): " + ", ".join(regressions))
    return bool(regressions)


def _cmd_server(args: argparse.Namespace) -> int:
    """An adapter's throwaway server (with node_cache, its node agent too)
    until SIGTERM or Ctrl-C; prints the options that reach it."""
    options = _adapter_options(args.option)
    from dbwrap_py.testing.hooks import hooks_for

    if hooks_for(args.adapter).throwaway_server(options) is None:
        print(f"{args.adapter}: no throwaway server (it needs none, or endpoints were given)")
        return 1

    serve_until_stopped(
        backend_options(args.adapter, options),
        lambda reach: f"{args.adapter}: running; use:\n  " + " ".join(
            f"-o {k}={shown_value(k, v)}" for k, v in reach.items()),
    )
    return 0


def _cmd_ceph(args: argparse.Namespace) -> int:
    """A throwaway Ceph of ``--osds`` OSDs until SIGTERM or Ctrl-C; prints
    the rados adapter's options that reach it."""
    from dbwrap_py.testing.servers import rados as _rados_server
    from dbwrap_py.servers import ServerError

    try:
        return _rados_server.main(["--osds", str(args.osds), "--auth", args.auth])
    except ServerError as exc:  # its daemons' log tails say why: no traceback needed
        print(f"dbwrap-py ceph: {exc}", file=sys.stderr)
        return 1


def _cmd_cassandra(args: argparse.Namespace) -> int:
    """A throwaway Cassandra of ``--nodes`` nodes until SIGTERM or Ctrl-C;
    prints the cassandra adapter's options that reach it."""
    from dbwrap_py.testing.servers import cassandra as _cassandra_server
    from dbwrap_py.servers import ServerError

    try:
        return _cassandra_server.main(["--nodes", str(args.nodes), "--paxos-variant", args.paxos_variant,
                                       "--auth", args.auth])
    except ServerError as exc:  # its nodes' log tails (or Maven's output) say why: no traceback needed
        print(f"dbwrap-py cassandra: {exc}", file=sys.stderr)
        return 1


def _cmd_zookeeper(args: argparse.Namespace) -> int:
    """A throwaway ZooKeeper of ``--nodes`` servers until SIGTERM or Ctrl-C;
    prints the zookeeper adapter's options that reach it."""
    from dbwrap_py.testing.servers import zookeeper as _zookeeper_server
    from dbwrap_py.servers import ServerError

    try:
        return _zookeeper_server.main(["--nodes", str(args.nodes)])
    except ServerError as exc:  # its servers' log tails say why: no traceback needed
        print(f"dbwrap-py zookeeper: {exc}", file=sys.stderr)
        return 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from dbwrap_py.bench import smb

    print(f"dbwrap_py demo: Debian's smbd with its volatile databases on bridge+{args.adapter},\n"
          f"against native tdb, smb2.bench.path-contention-shared, {args.nprocs} connections,"
          f" {args.time}s each")
    points = smb.run([args.nprocs], args.time, adapter=args.adapter)
    native, bridge = points
    print(f"\n{'':16}{'opens/s':>10}{'closes/s':>10}")
    for p in points:
        print(f"{p.mode:16}{p.opens_per_second:>10.0f}{p.closes_per_second:>10.0f}")
    ratio = bridge.opens_per_second / native.opens_per_second if native.opens_per_second else 0
    print(f"{'ratio':16}{ratio:>10.2f}"
          f"{bridge.closes_per_second / native.closes_per_second if native.closes_per_second else 0:>10.2f}")
    failed = [p for p in points if not p.ok]
    if failed:  # the cause goes last, where a reader of a failed run looks first
        p = failed[0]
        print(f"demo failed: {p.mode} measured {p.opens_per_second:.0f} opens/s: "
              + (p.failure_lines() or ["no cause found"])[0])
        return 1
    return 0


def _cmd_soak(args: argparse.Namespace) -> int:
    from dbwrap_py.soak import soak

    nprocs = [int(n) for n in args.nprocs.split(",")]
    result = soak(args.adapter, args.points, nprocs, args.time, _adapter_options(args.option),
                  after_failure=args.after_failure)
    if result.ok:
        print(f"soak: {result.points} points, none failed")
        return 0
    print(f"soak: point {result.failed_at + 1} of {result.points} failed; the report is above")
    return 1


def _cmd_bench_ca(args: argparse.Namespace) -> int:
    import json
    from contextlib import ExitStack
    from dataclasses import asdict

    from dbwrap_py import smbtorture
    from dbwrap_py.bench import ca
    from dbwrap_py.bench.targets import display_name

    configurations = torture_configurations(args.config or ["tdb", "etcd,node_cache=yes"], "tdb", [])
    nprocs = [int(n) for n in args.nprocs.split(",")]
    with ExitStack() as stack:  # each configuration's throwaway servers, stopped on the way out
        backends = [("native", ca.native_setup())]
        for adapter, options in configurations:
            reach = stack.enter_context(backend_options(adapter, options))
            label = ",".join([f"bridge+{display_name(adapter, options)}",
                              *(f"{k}={shown_value(k, v)}" for k, v in options.items())])
            backends.append((label, smbtorture.setup_for("bridge", adapter, reach, persistent_handles=True)))
        print(f"open+close with a persistent handle asked for, {args.time:g}s per point; "
              "the CA share against a plain one", flush=True)
        points = ca.sweep(backends, nprocs, args.time, report=lambda line: print(line, flush=True))
    print("\n" + "\n".join(ca.table(points)))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps([asdict(p) for p in points], indent=1))
    failed = [p for p in points if p.errors or p.opens == 0]
    for p in failed:
        print(f"failed: {p.backend} {p.share} nprocs={p.nprocs}: "
              f"{p.errors[0] if p.errors else 'no open completed'}", file=sys.stderr)
    return 1 if failed else 0


def _cmd_bench_ca_cluster(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from dbwrap_py.bench import ca_cluster

    nprocs = [int(n) for n in args.nprocs.split(",")]
    backends = [b for b in args.backends.split(",") if b]
    print(f"three-node clusters, the CA share: open+close with a persistent handle, {args.time:g}s per point,"
          f" clients spread over the nodes; then {args.held} persistent opens held", flush=True)
    points, footprints = ca_cluster.run(backends, nprocs, args.time, args.held,
                                        report=lambda line: print(line, flush=True))
    print("\n" + "\n".join(ca_cluster.table(points, footprints)))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "points": [asdict(p) for p in points],
        "footprints": [{**asdict(f), "per_open": f.per_open} for f in footprints]}, indent=1))
    failed = [f"{p.backend} clients={p.nprocs}: {p.errors[0] if p.errors else 'no open completed'}"
              for p in points if p.errors or p.opens == 0]
    failed += [f"{f.configuration} footprint: {'; '.join(f.errors)}" for f in footprints if f.errors]
    for why in failed:
        print(f"failed: {why}", file=sys.stderr)
    return 1 if failed else 0


def _cmd_bench_smb(args: argparse.Namespace) -> int:
    from contextlib import ExitStack
    from dataclasses import asdict

    from dbwrap_py.bench import charts, smb, targets
    from dbwrap_py.bench.progress import SweepProgress
    from dbwrap_py.errors import ConfigError
    from dbwrap_py.samba import VOLATILE_DATABASES

    nprocs = [int(n) for n in args.nprocs.split(",")]
    skipped: dict[str, str] = {}
    local = [db for db in args.local.split(",") if db]
    unknown = sorted(set(local) - set(VOLATILE_DATABASES))
    if unknown:
        raise ConfigError(f"--local: {', '.join(unknown)} is not one of smbd's volatile databases "
                          f"({', '.join(VOLATILE_DATABASES)})")
    with ExitStack() as stack:
        ready = targets.ready_adapters(args.adapters, args.option, True, stack, print)
        runs = targets.over_transports(stack, ready, targets.parse_transports(args.transports), print)
        backends = [smb.Backend(None)] + [smb.Backend(a, o, local) for a, o in runs]
        print(f"path-contention-shared, {args.time}s per point, {args.rounds} round(s): "
              + ", ".join(b.label for b in backends)
              + (f"; on native tdb still: {', '.join(local)}" if local else ""))
        with SweepProgress(len(backends), nprocs, args.rounds, args.time) as progress:
            def done(p: smb.Point) -> None:
                progress.done(p.nprocs, smb.point_line(p))

            def skip(label: str, why: str) -> None:
                skipped[label] = why
                progress.skip(label, why)

            points = smb.sweep(backends, nprocs, args.time, args.rounds,
                                    on_start=progress.start, on_point=done, on_error=skip)
    rows = smb.sweep_summary(points)
    print("\nopens/s (ratio to native tdb)\n" + "\n".join(smb.table_lines(rows)))
    out = Path(args.json)
    stem = out.with_suffix("")
    smb.write_sweep_json(out, points, rows, args.time, args.rounds, skipped)
    smb.write_csv(stem.with_suffix(".csv"), [asdict(p) for p in points])
    smb.write_csv(stem.with_name(stem.name + "-summary.csv"), rows)
    pngs = charts.sweep_charts(rows, stem, args.time) if points else []
    print("results: " + ", ".join(str(p) for p in [out, stem.with_suffix(".csv"), *pngs]))
    return 0


def _cmd_bench_cluster(args: argparse.Namespace) -> int:
    from dbwrap_py.bench import cluster, smb
    from dbwrap_py.bench.progress import SweepProgress
    from dbwrap_py.errors import ConfigError
    from dbwrap_py.samba import VOLATILE_DATABASES

    nprocs = sorted({int(n) for n in args.nprocs.split(",") if n.strip()})
    local = [db for db in args.node_local.split(",") if db]
    unknown = sorted(set(local) - set(VOLATILE_DATABASES))
    if unknown:
        raise ConfigError(f"--node-local: {', '.join(unknown)} is not one of smbd's volatile databases")
    args.network = cluster.network_named(args.network)
    network = cluster.network_settings(args.network)
    configs = cluster.configurations(args.adapters, args.option, local, args.network)
    print(f"{cluster.NODES}-node Samba cluster, workload {args.workload}, "
          + (f"network {args.network} ({network['network']['method']}: "
             f"delays {network['network']['delayed']}), " if network else "")
          + f"{args.time}s per point, {args.rounds} round(s), clients {','.join(map(str, nprocs))}: "
          + ", ".join(c.label for c in configs) + f"\n{cluster.note(network=network.get('network'), workload=args.workload)}")
    if args.adapters.strip() in ("", "auto", "all"):
        print("not in auto: " + "; ".join(f"{name} ({why})" for name, why in cluster.left_out().items()))
    began = time.monotonic()
    with SweepProgress(len(configs), nprocs, args.rounds, args.time, "bench cluster",
                       setup_seconds=cluster.SETUP_SECONDS) as progress:
        def set_up(label: str, round_index: int, why: str) -> None:
            progress.set_up()
            if why:
                progress.bar.write(f"  {label}, round {round_index + 1}: did not start: {why}")

        events = cluster.Events(
            start=progress.start, point=lambda p: progress.done(p.nprocs, smb.point_line(p, 26)),
            skip=lambda label, n, why: progress.skip_point(n, f"  nprocs={n:<4} {label:<26} not run: {why}"),
            set_up=set_up)
        results = cluster.Sweep(configs, nprocs, args.time, args.rounds, events, workload=args.workload).run()
    elapsed = time.monotonic() - began
    rows = cluster.summary(results)
    print("\n" + "\n".join(cluster.report_lines(rows, results)))
    settings = {"nodes": cluster.NODES, "nprocs": nprocs, "seconds_per_point": args.time,
                "rounds": args.rounds, "elapsed_seconds": round(elapsed), "workload": args.workload, **network}
    out = Path(args.json or ("results/bench-cluster.json" if args.workload == cluster.SHARED
                             else f"results/bench-cluster-{args.workload}.json"))
    files = cluster.write_results(out, results, rows, configs, settings)
    print(f"took {elapsed / 60:.1f} min; results: " + ", ".join(map(str, files)))
    return 130 if results.interrupted else 0


def _cmd_bench_handover(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from dbwrap_py.bench import handover

    print(f"bench handover: {args.adapter}, {args.a_procs} process(es) on node a and {args.b_procs} on "
          f"node b lock one record for {args.time:g} s, holding it {args.hold_ms:g} ms each time")
    result = handover.run(args.adapter, _adapter_options(args.option), args.a_procs, args.b_procs,
                          args.time, args.hold_ms)
    print("\n".join(handover.report_lines(result)))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**asdict(result), "fairness": result.fairness, "lost": result.lost,
                               "longest_wait_ms": result.longest_wait_ms}, indent=2) + "\n")
    print(f"results: {out}")
    failed = [w for w in result.workers if w.error]
    return 1 if failed or result.lost else 0


def _cmd_bench_elastic(args: argparse.Namespace) -> int:
    from dbwrap_py.bench import elastic

    events = elastic.parse_events(args.events)
    elastic.check_timing(args.at, args.time, args.nprocs)
    configs = elastic.chosen(args.adapters, args.option)
    bin_seconds = 1.0 if args.client == elastic.SMBTORTURE and args.bin is None else args.bin or elastic.DEFAULT_BIN
    load = elastic.Load(args.nprocs, args.time, args.client, bin_seconds)
    print(f"3-node Samba cluster, {args.nprocs} clients on nodes 0 and 1, {args.time}s; at {args.at:g}s: "
          f"{', '.join(events)}; " + ", ".join(c.label for c in configs)
          + f"\n{elastic.note(load.client, load.bin_seconds)}")
    began = time.monotonic()
    runs = elastic.run_all(configs, events, load, args.at)
    elapsed = time.monotonic() - began
    print("\n" + "\n".join(elastic.table_lines(runs)))
    settings = {"nodes": 3, "nprocs": args.nprocs, "seconds": args.time, "at": args.at, "events": events,
                "client": load.client, "bin_seconds": load.bin_seconds, "elapsed_seconds": round(elapsed)}
    files = elastic.write_results(Path(args.json), runs, configs, settings, args.at)
    print(f"took {elapsed / 60:.1f} min; results: " + ", ".join(map(str, files)))
    return 0 if runs and all(r.ok for r in runs) else 1


def _cmd_bench_micro(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from dbwrap_py.bench import micro, targets
    from dbwrap_py.paths import build_dir

    binary = build_dir() / "bench_micro"
    if not binary.exists():
        print(f"{binary} is missing: run make", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        ready = targets.ready_adapters(args.adapters, args.option, False, stack, print)
        backends = [micro.NATIVE, *ready]
        results = micro.run(
            binary, backends, ready, args.ops, args.time, args.keys,
            on_backend=lambda b: print(f"bench micro: {b}", flush=True),
            on_error=lambda b, why: print(f"skipping {b}: {why}", flush=True))
    print("\n" + "\n".join(micro.table(results)))
    out = Path(args.json)
    settings = {"max_ops": args.ops, "seconds_per_workload": args.time, "keys": args.keys}
    micro.write_json(out, results, settings)
    micro.write_csv(out.with_suffix(".csv"), results)
    print(f"results: {out}, {out.with_suffix('.csv')}")
    return 0


def _cmd_bench_memory(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from dbwrap_py.bench import charts, memory, smb, targets

    counts = [int(n) for n in args.connections.split(",")]
    with ExitStack() as stack:
        ready = targets.ready_adapters(args.adapters, args.option, True, stack, print)
        runs = targets.over_transports(stack, ready, targets.parse_transports(args.transports), print)
        backends = [smb.Backend(None)] + [smb.Backend(a, o) for a, o in runs]
        sambas = smb.start_sambas(stack, backends,
                                       lambda label, why: print(f"skipping {label}: {why}"))
        daemons = {b.label: memory.daemon_pid(b.options["proxy_socket"]) for b in backends
                   if b.options.get("transport") == "proxy"}
        rows = memory.measure(
            sambas, counts,
            on_start=lambda b, n: print(f"bench memory: {b}, {n} connections", flush=True),
            daemons={label: pid for label, pid in daemons.items() if pid is not None})
    print("\nper smbd client process\n" + "\n".join(memory.table_lines(rows)))
    out = Path(args.json)
    memory.write_json(out, rows)
    smb.write_csv(out.with_suffix(".csv"), memory.as_dicts(rows))
    png = charts.memory_chart(memory.as_dicts(rows), out.with_suffix(".png")) if rows else None
    print(f"results: {out}, {out.with_suffix('.csv')}" + (f", {png}" if png else ""))
    return 0


class _Side(argparse.Action):
    """--from / --to: store the adapter, and make later -o options its own."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.side = "from" if self.dest == "source" else "to"


class _SideOption(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        if namespace.side is None:
            parser.error(f"{option_string} {values}: name --from or --to before its options")
        dest = f"{namespace.side}_options"  # a new list: the default one is shared
        setattr(namespace, dest, [*getattr(namespace, dest), values])


def _cmd_bench_instructions(args: argparse.Namespace) -> int:
    import json

    from dbwrap_py.bench import instructions
    from dbwrap_py.paths import build_dir

    binary = build_dir() / "bench_bridge"
    if not binary.exists():
        print(f"{binary} is missing: run make build/bench_bridge", file=sys.stderr)
        return 2
    try:
        extra = (args.extra, _adapter_options(args.option)) if args.extra else None
        results = instructions.measure(binary, [b for b in args.backends.split(",") if b],
                                       args.iterations, extra)
    except instructions.InstructionsError as exc:
        print(f"bench instructions: {exc}", file=sys.stderr)
        return 1
    print("\n".join(instructions.table_lines(results)))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"iterations": args.iterations, "instructions_per_call": results},
                              indent=1) + "\n")
    print(f"results: {out}")
    return 0


#: the node agent's metrics ``status`` shows, with their labels there
_STATUS_METRICS = (
    ("dbwrap_py_node_agent_owned_records", "owned records"),
    ("dbwrap_py_node_agent_owned_buckets", "owned buckets"),
    ("dbwrap_py_node_agent_pending_release_requests", "pending release requests"),
    ("dbwrap_py_node_agent_release_requests_served", "release requests served"),
    ("dbwrap_py_node_agent_records_handed_back", "records handed back"),
    ("dbwrap_py_node_agent_lease_renewal_failures", "lease renewal failures"),
    ("dbwrap_py_node_agent_lease_regrants", "lease re-grants"),
)


def _agent_metrics(cache_dir: Path) -> tuple[str, dict[str, float]] | None:
    """(URL, sample values by name) of the agent's metrics, or None when it
    serves none (no agent.metrics)."""
    from dbwrap_py.metrics import agent_metrics_url, scrape

    url = agent_metrics_url(cache_dir)
    return (url, scrape(url)) if url is not None else None


def _cmd_status(args: argparse.Namespace) -> int:
    from dbwrap_py.nodecache.state import STATE_FILE, read_header

    cache_dir = Path(args.cache_dir)
    try:
        state = read_header(cache_dir)
    except FileNotFoundError:
        print(f"dbwrap-py status: no node agent serves {cache_dir} (no {STATE_FILE}): start one with "
              f"dbwrap-py node-agent --cache-dir {cache_dir} ...", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"dbwrap-py status: {exc}", file=sys.stderr)
        return 1
    alive = True
    try:
        os.kill(state.agent_pid, 0)
    except ProcessLookupError:
        alive = False
    except PermissionError:
        pass
    print(f"node {state.node}: agent pid {state.agent_pid} {state.status}"
          + ("" if alive else " (not running: it crashed; the node's records are void)"))
    left = state.valid_until - time.monotonic()
    if state.lease_id and left > 0:
        print(f"lease {state.lease_id:x}: valid for {left:.1f} s more")
    else:
        print(f"lease {state.lease_id:x}: not valid now" if state.lease_id else "lease: none")
    if not alive:
        return 1
    try:
        metrics = _agent_metrics(cache_dir)
    except (OSError, ValueError, DbwrapError) as exc:
        print(f"metrics: not read ({exc})")
        return 1
    if metrics is None:
        print("metrics: not served (the agent has no --metrics-port)")
        return 0
    url, values = metrics
    print(f"metrics: {url}")
    for name, label in _STATUS_METRICS:
        for sample in (name, name + "_total"):
            if sample in values:
                print(f"  {label}: {values[sample]:g}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dbwrap-py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    adapters = sub.add_parser("adapters", help="list built-in adapters")
    adapters.add_argument("--options", action="store_true",
                          help="also each adapter's options: type, default, minimum, secret")
    adapters.set_defaults(fn=_cmd_adapters)
    for name, fn, extra in (
        ("dump", _cmd_dump, ()),
        ("get", _cmd_get, ("key",)),
        ("put", _cmd_put, ("key", "value")),
    ):
        cmd = sub.add_parser(name)
        cmd.add_argument("adapter", help="short name (tdb) or dotted module")
        cmd.add_argument("db", help="database name, as smbd passes it to db_open")
        for arg in extra:
            cmd.add_argument(arg)
        cmd.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                         help="adapter option (repeatable)")
        cmd.add_argument("--volatile", action="store_true",
                         help="open with TDB_CLEAR_IF_FIRST, as smbd opens locking.tdb")
        cmd.set_defaults(fn=fn)

    check = sub.add_parser("check", help="conformance suite: is Samba safe on an adapter?")
    check.add_argument("adapter", help="short name (tdb), dotted module, or 'native' for Samba's tdb")
    check.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                       help="adapter option (repeatable); give the endpoint to use your own server")
    check.add_argument("--variant", action="append", metavar="'K=V ...'",
                       help="also run the suite with these options added, on the same throwaway store "
                            "(repeatable; e.g. --variant node_cache=yes)")
    check.add_argument("--only", action="append", metavar="CHECK", help="run one check (repeatable)")
    check.add_argument("--pythonpath", action="append", metavar="DIR",
                       help="folder to import the adapter from (repeatable)")
    check.add_argument("--json", help="also write the results here")
    check.add_argument("-v", "--verbose", action="store_true", help="show the bridge's log lines")
    check.set_defaults(fn=_cmd_check)

    copy = sub.add_parser(
        "copy", help="copy persistent databases from one backend to another, and verify",
        description="Copy Samba databases between adapters, e.g. before switching"
                    " dbwrap_py:module. Each -o belongs to the --from or --to before it.")
    copy.add_argument("--from", dest="source", action=_Side, metavar="ADAPTER",
                      help="the adapter the databases are on now")
    copy.add_argument("--to", dest="destination", action=_Side, metavar="ADAPTER",
                      help="the adapter to copy them to")
    copy.add_argument("-o", "--option", action=_SideOption, metavar="K=V",
                      help="an option of the adapter named before it (repeatable)")
    copy.add_argument("--overwrite", action="store_true",
                      help="replace what a non-empty destination holds")
    copy.add_argument("--configfile", "-s", metavar="SMB.CONF",
                      help="the Samba whose daemons must be stopped (pid directory), and"
                           " whose databases --persistent names")
    copy.add_argument("--persistent", action="store_true",
                      help="every persistent database of --configfile's Samba")
    copy.add_argument("--while-running", action="store_true",
                      help="copy even if Samba runs (its later writes are not copied)")
    copy.add_argument("db", nargs="*", help="database paths, as smbd passes them to db_open")
    copy.set_defaults(fn=_cmd_copy, from_options=[], to_options=[], side=None)

    samba = sub.add_parser("samba", help="run a throwaway smbd until Ctrl-C")
    samba.add_argument("--bridge", default="volatile",
                       help="databases behind the bridge: 'volatile' (default), a comma list, or ''")
    samba.add_argument("--port", type=int, default=None)
    cluster = sub.add_parser("cluster", help="a Samba cluster on 127.0.0.1-3 (ctdbd and smbd per node) "
                                             "until Ctrl-C")
    cluster.add_argument("--nodes", type=int, default=3)
    cluster.add_argument("--adapter", default="", help="adapter for --databases; default: ctdb keeps them all")
    cluster.add_argument("--databases", default="locking",
                         help="with --adapter: 'locking' (locking, brlock, leases; default), 'volatile' "
                              "(all eight), or a comma list")
    cluster.add_argument("--node-local", default="",
                         help="databases each node keeps to itself (ctdb:DB = no), a comma list, "
                              "e.g. smbXsrv_open_global.tdb")
    cluster.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                         help="adapter option (repeatable), e.g. node_cache=yes")
    cluster.set_defaults(fn=_cmd_cluster)
    status = sub.add_parser("status", help="this node's view: the node agent's lease, and its metrics if "
                                           "it serves them")
    status.add_argument("--cache-dir", required=True, help="the node agent's cache directory (node_cache_dir)")
    status.set_defaults(fn=_cmd_status)
    server = sub.add_parser("server", help="an adapter's throwaway server on 127.0.0.1 until Ctrl-C")
    server.add_argument("adapter", help="e.g. etcd")
    server.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                        help="adapter option (repeatable), e.g. node_cache=yes for a node agent too")
    server.set_defaults(fn=_cmd_server)
    ceph = sub.add_parser("ceph", help="a throwaway Ceph (one mon, memstore OSDs) on 127.0.0.1 until Ctrl-C")
    ceph.add_argument("--osds", type=int, default=1, choices=(1, 3),
                      help="3: pool size 3, min_size 2, for fault tests")
    ceph.add_argument("--auth", default="none", choices=("none", "cephx"),
                      help="cephx: keys for the daemons and client.admin (printed with the options)")
    ceph.set_defaults(fn=_cmd_ceph)
    cassandra = sub.add_parser("cassandra", help="a throwaway Apache Cassandra on 127.0.0.1-3 until Ctrl-C")
    cassandra.add_argument("--nodes", type=int, default=1, choices=(1, 3),
                           help="3: one node each on 127.0.0.1-3, replication_factor 3, for fault tests")
    cassandra.add_argument("--paxos-variant", default="v2", choices=("v1", "v2"),
                           help="the lightweight transactions' Paxos (Cassandra 5.0's own default is v1)")
    cassandra.add_argument("--auth", default="none", choices=("none", "password"),
                           help="password: PasswordAuthenticator, superuser cassandra/cassandra"
                                " (printed with the options)")
    cassandra.set_defaults(fn=_cmd_cassandra)
    zookeeper = sub.add_parser("zookeeper", help="a throwaway ZooKeeper on 127.0.0.1 until Ctrl-C")
    zookeeper.add_argument("--nodes", type=int, default=1, choices=(1, 3),
                           help="3: an ensemble of three servers (a quorum of two), for fault tests")
    zookeeper.set_defaults(fn=_cmd_zookeeper)
    torture = sub.add_parser("torture", help="smbtorture suites, native against the bridge")
    torture.add_argument("--suite", action="append", help="a suite (repeatable); default: all")
    torture.add_argument("--config", action="append", default=[], metavar="ADAPTER[,K=V...]",
                         help="a bridge configuration (repeatable), each compared with one native run"
                              " of every suite; instead of --adapter and -o")
    torture.add_argument("--config-short", action="append", default=[], metavar="ADAPTER[,K=V...]",
                         help="as --config, leaving out the three longest suites"
                              " (smb2.oplock, smb2.lease, smb2.durable-open): for slow backends")
    torture.add_argument("--config-brief", action="append", default=[], metavar="ADAPTER[,K=V...]",
                         help="as --config-short, also leaving out smb2.lock and smb2.durable-v2-open:"
                              " for backends whose every record operation is a consensus round")
    torture.add_argument("--parallel", type=int, default=2, metavar="N",
                         help="smbtorture runs at a time, native and bridge together (default 2)")
    torture.add_argument("--persistent-handles", action="store_true",
                         help="Samba 4.25: persistent handles on, a continuously available share;"
                              " the persistent-handle suites by default")
    demo = sub.add_parser("demo", help="the main job: smbd on the bridge against native tdb")
    demo.add_argument("--time", type=int, default=5)
    demo.add_argument("--nprocs", type=int, default=4)
    soak_cmd = sub.add_parser("soak", help="node cache: path-contention points until one fails")
    soak_cmd.add_argument("--adapter", default="etcd", help="an adapter with the node cache")
    soak_cmd.add_argument("--points", type=int, default=500)
    soak_cmd.add_argument("--nprocs", default="1,16", help="connection counts, in turn")
    soak_cmd.add_argument("--time", type=int, default=3, help="seconds per point")
    soak_cmd.add_argument("--after-failure", type=int, default=2,
                          help="points run after a failure, to see whether it stays")
    soak_cmd.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                          help="adapter option (repeatable); give an endpoint and node_cache_dir"
                               " to soak your own deployment")
    soak_cmd.set_defaults(fn=_cmd_soak)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    smb = bench_sub.add_parser("smb", help="path-contention-shared sweep, every adapter against native tdb")
    smb.add_argument("--nprocs", default="1,2,4,8,16,32,64,128", help="comma list of client counts")
    smb.add_argument("--time", type=int, default=10, help="seconds per point")
    smb.add_argument("--rounds", type=int, default=1, help="passes over every point")
    smb.add_argument("--local", default="", metavar="DB,DB",
                     help="volatile databases left on native tdb, e.g. smbXsrv_open_global.tdb "
                          "(the seed's configuration: node-local)")
    smb.add_argument("--json", default="results/bench-smb.json",
                     help="results file; the .csv, -summary.csv, -ops.png and -latency.png go next to it")
    smb.set_defaults(fn=_cmd_bench_smb)
    bench_cluster = bench_sub.add_parser(
        "cluster", help="path-contention-shared on a 3-node Samba cluster, every adapter against ctdb")
    bench_cluster.add_argument("--nprocs", default="1,2,4,8,16,32,64,128,256,512",
                               help="comma list of client counts (spread over the nodes)")
    bench_cluster.add_argument("--time", type=int, default=5, help="seconds per point")
    bench_cluster.add_argument("--rounds", type=int, default=2,
                               help="passes over every configuration; each starts its clusters afresh")
    bench_cluster.add_argument("--adapters", "--adapter", default="auto",
                               help="comma list; NAME+cache runs NAME with node_cache=yes; 'auto': every "
                                    "adapter with a server, without and with the node cache. ctdb always "
                                    "runs, as the reference; ctdb-sticky adds ctdb with sticky records "
                                    "(ctdb setdbsticky on the locking databases)")
    bench_cluster.add_argument("-o", "--option", action="append", default=[], metavar="[ADAPTER:]K=V",
                               help="adapter option (repeatable), e.g. etcd:node_cache=yes")
    bench_cluster.add_argument("--node-local", default="smbXsrv_open_global.tdb", metavar="DB,DB",
                               help="volatile databases each node keeps to itself, on every line, ctdb's "
                                    "too (ctdb:DB = no; default as in the seed talks; '' for none)")
    bench_cluster.add_argument("--network", metavar="PROFILE",
                               help="loopback (the default: loopback addresses, no namespaces), or every "
                                    "node in a network namespace of its own, apart by a delay (tc "
                                    "netem, else a TCP relay per node): lan, region, wan, multi-region "
                                    "(node 2 15 ms from the rest; the relay only), or local (no delay); "
                                    "docs/benchmarks.md says what is delayed")
    bench_cluster.add_argument("--workload", default="shared", choices=("shared", "own-files"),
                               help="shared: every client opens one path (a hot record); own-files: each "
                                    "client a file of its own (cold records; docs/benchmarks.md)")
    bench_cluster.add_argument("--json", default=None,
                               help="results file (results/bench-cluster[-WORKLOAD].json); the .csv, "
                                    "-summary.csv, -ops.png and -latency.png go next to it")
    bench_cluster.set_defaults(fn=_cmd_bench_cluster)
    elastic = bench_sub.add_parser(
        "elastic", help="opens/s second by second on nodes 0 and 1 while node 2 is killed, leaves or joins, "
                        "ctdb against adapters")
    elastic.add_argument("--adapters", "--adapter", default="etcd+cache",
                         help="comma list, as bench cluster's; ctdb always runs, as the reference")
    elastic.add_argument("-o", "--option", action="append", default=[], metavar="[ADAPTER:]K=V",
                         help="adapter option (repeatable), e.g. etcd:node_cache=yes")
    elastic.add_argument("--nprocs", type=int, default=64, help="clients, spread over nodes 0 and 1")
    elastic.add_argument("--time", type=int, default=30, help="seconds the clients run")
    elastic.add_argument("--client", choices=("open-loop", "smbtorture"), default="open-loop",
                         help="build/smb_open_loop (bins of --bin seconds) or smbtorture's "
                              "path-contention-shared (1 s samples)")
    elastic.add_argument("--bin", type=float, default=None,
                         help="seconds per bin with the open loop (default 0.5)")
    elastic.add_argument("--at", type=float, default=10.0,
                         help="seconds after the clients started when node 2 changes")
    elastic.add_argument("--events", default="kill,leave,join",
                         help="comma list of kill, leave, join; each on a fresh cluster")
    elastic.add_argument("--json", default="results/bench-elastic.json",
                         help="results file; the chart (.png) goes next to it")
    elastic.set_defaults(fn=_cmd_bench_elastic)
    handover = bench_sub.add_parser(
        "handover", help="one hot record wanted by processes on two nodes through the node cache: "
                         "locks per process and the longest wait (fairness of the hand-over)")
    handover.add_argument("--adapter", default="sqlite_leased",
                          help="an adapter with the node cache (sqlite_leased needs no server)")
    handover.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                          help="adapter option (repeatable): its reach, for one that needs a server")
    handover.add_argument("--a-procs", type=int, default=3, help="processes on node a")
    handover.add_argument("--b-procs", type=int, default=1, help="processes on node b")
    handover.add_argument("--time", type=float, default=5.0, help="seconds the processes take the lock")
    handover.add_argument("--hold-ms", type=float, default=0.5, help="milliseconds each lock is held")
    handover.add_argument("--json", default="results/bench-handover.json", help="results file")
    handover.set_defaults(fn=_cmd_bench_handover)
    ca = bench_sub.add_parser("ca", help="Samba 4.25: opens/s with persistent handles, a continuously "
                                         "available share against a plain one, native and bridged")
    ca.add_argument("--nprocs", default="1,4,16,64", help="comma list of client counts")
    ca.add_argument("--time", type=float, default=5.0, help="seconds per point")
    ca.add_argument("--config", action="append", default=[], metavar="ADAPTER[,K=V...]",
                    help="a bridge configuration (repeatable); default: tdb and etcd,node_cache=yes")
    ca.add_argument("--json", default="results/bench-ca.json")
    ca.set_defaults(fn=_cmd_bench_ca)
    ca_cluster = bench_sub.add_parser("ca-cluster", help="Samba 4.25: opens/s on a CA share of three-node "
                                                         "clusters and bytes per persistent open, against ctdb")
    ca_cluster.add_argument("--nprocs", default="1,4,16,64", help="comma list of client counts")
    ca_cluster.add_argument("--time", type=float, default=5.0, help="seconds per point")
    ca_cluster.add_argument("--backends", default="etcd,rados,cassandra",
                            help="comma list, each with a write-back node cache; ctdb always runs first")
    ca_cluster.add_argument("--held", type=int, default=32, help="persistent opens held for the bytes per open")
    ca_cluster.add_argument("--json", default="results/bench-ca-cluster.json")
    ca_cluster.set_defaults(fn=_cmd_bench_ca_cluster)
    micro = bench_sub.add_parser("micro", help="per-operation p50/p99 through the bridge, YCSB-style mixes")
    micro.add_argument("--ops", type=int, default=20000, help="at most this many operations per workload")
    micro.add_argument("--time", type=float, default=2.0, help="and at most this many seconds per workload")
    micro.add_argument("--keys", type=int, default=1000, help="records in the key space")
    micro.add_argument("--json", default="results/bench-micro.json")
    micro.set_defaults(fn=_cmd_bench_micro)
    memory = bench_sub.add_parser("memory", help="RSS and PSS per smbd client process, native against bridged")
    memory.add_argument("--connections", default="1,16,64", help="comma list of connection counts")
    memory.add_argument("--json", default="results/bench-memory.json")
    memory.set_defaults(fn=_cmd_bench_memory)
    instr = bench_sub.add_parser("instructions",
                                 help="instructions per dbwrap call under callgrind, per backend")
    instr.add_argument("--backends", default=",".join(("native-tdb", "bridge+tdb", "bridge+tdb-py",
                                                       "bridge+memory")))
    instr.add_argument("--iterations", type=int, default=2000)
    instr.add_argument("--extra", metavar="ADAPTER",
                       help="also this adapter (its throwaway server started), with -o options")
    instr.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                       help="an option of --extra's adapter (repeatable)")
    instr.add_argument("--json", default="results/bench-instructions.json")
    instr.set_defaults(fn=_cmd_bench_instructions)
    for cmd in (smb, memory):
        cmd.add_argument("--transports", default="", metavar="inproc,proxy,proxy-fastpath",
                         help="run each adapter in process, through the node daemon, or both "
                              "(each proxy run starts a throwaway daemon); default: as -o says")
    for cmd in (smb, micro, memory):
        cmd.add_argument("--adapters", "--adapter", default="auto",
                         help="comma list of adapters, or 'auto' for every one that has landed;"
                              " native tdb always runs as the reference")
        cmd.add_argument("-o", "--option", action="append", default=[], metavar="[ADAPTER:]K=V",
                         help="adapter option (repeatable), e.g. etcd:endpoints=127.0.0.1:2379")
    for cmd, fn in ((samba, _cmd_samba), (torture, _cmd_torture), (demo, _cmd_demo)):
        cmd.add_argument("--adapter", default="tdb", help="adapter for the bridged databases")
        cmd.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                         help="adapter option (repeatable)")
        cmd.set_defaults(fn=fn)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM ends a command like Ctrl-C does, so every smbd it started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["node-agent"]:  # its own options and signals: SIGTERM drains it
        from dbwrap_py.nodecache.agent import main as agent_main

        return agent_main(argv[1:])
    if argv[:1] == ["proxy-daemon"]:  # its own options and signals: SIGTERM closes it cleanly
        from dbwrap_py.proxy.daemon import main as proxy_main

        return proxy_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except DbwrapError as exc:
        status = NAMES.get(exc.ntstatus, f"0x{exc.ntstatus:08x}")
        print(f"dbwrap-py: {type(exc).__name__}: {exc} ({status})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
