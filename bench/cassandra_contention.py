"""Does the seed talk's "LWT errors under contention" happen here? Processes
increment one record through the cassandra adapter (take, then write+unlock,
all LWTs) for a while; every error the adapter raised and every unknown
outcome it resolved is counted, and the final value is checked against the
acknowledged increments. A measurement, not a test:

    .venv/bin/python bench/cassandra_contention.py [--processes 8] [--seconds 20] [--nodes 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec
from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.testing.servers.cassandra import CassandraCluster
from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter
from dbwrap_py.errors import DbwrapError
from dbwrap_py.options import Options

KEY = b"hot"


def _worker(options: dict[str, str], path: str, stop_at: float, out) -> None:
    try:
        _increments(options, path, stop_at, out)
    except BaseException as exc:  # the parent prints why, instead of waiting for nothing
        out.put(f"{type(exc).__name__}: {exc}")


def _increments(options: dict[str, str], path: str, stop_at: float, out) -> None:
    db = CassandraAdapter(DatabaseSpec(path, tdb_flags=TDB_CLEAR_IF_FIRST), Options(options))
    unknown = 0
    lwt = db.client.lwt

    def counting(*args, **kwargs):  # unknown outcomes the adapter resolved
        nonlocal unknown
        try:
            return lwt(*args, **kwargs)
        except cc.OutcomeUnknown:
            unknown += 1
            raise

    db.client.lwt = counting  # type: ignore[method-assign]
    acked, errors = 0, Counter()
    while time.monotonic() < stop_at:
        try:
            value = db.lock_get(KEY)
            db.put_unlock(KEY, b"%d" % (int(value or b"0") + 1))
            acked += 1
        except DbwrapError as exc:
            errors[type(exc).__name__] += 1
    out.put((acked, dict(errors), unknown, db.client.requests))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    args = parser.parse_args()
    with CassandraCluster(nodes=args.nodes) as cluster:
        options = {**cluster.options(), "op_timeout": "10"}
        path = "/dbwrap-py-bench/contention.tdb"
        keeper = CassandraAdapter(DatabaseSpec(path, tdb_flags=TDB_CLEAR_IF_FIRST), Options(options))
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        stop_at = time.monotonic() + args.seconds
        procs = [ctx.Process(target=_worker, args=(options, path, stop_at, out)) for _ in range(args.processes)]
        for p in procs:
            p.start()
        results = [out.get(timeout=args.seconds + 120) for _ in procs]
        for p in procs:
            p.join()
        failed = [r for r in results if isinstance(r, str)]
        if failed:
            print("workers failed:", *failed, sep="\n  ")
            return 1
        acked = sum(r[0] for r in results)
        errors: Counter = Counter()
        for r in results:
            errors.update(r[1])
        unknown = sum(r[2] for r in results)
        stored = int(keeper.get(KEY) or b"0")
        print(f"{args.processes} processes, one record, {args.seconds:g} s, {args.nodes} node(s): "
              f"{acked} increments acknowledged ({acked / args.seconds:.0f}/s), stored {stored}; "
              f"errors {dict(errors) or 'none'}; unknown outcomes resolved {unknown}; "
              f"requests {sum(r[3] for r in results)}")
        keeper.close()
        return 0 if stored >= acked else 1


if __name__ == "__main__":
    sys.exit(main())
