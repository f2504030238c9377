"""What the consistency options and paxos_variant cost: a locked write
(take, then write+unlock: both LWTs) and a plain fetch, one process, no
contention, on a throwaway three-node cluster (RF 3) per paxos_variant, for
each pair of consistency / serial_consistency. Rates, median and 99th
percentile latency, and requests per operation; in ``--rounds`` rounds,
the settings' order rotated each round (the JVMs keep warming up), each
figure the median of the rounds. A measurement, not a test:

    .venv/bin/python bench/cassandra_settings.py [--seconds 5] [--rounds 3] [--variants v1,v2]

Each cluster node is a JVM on this host, so a round trip between nodes is a
loopback hop: the numbers rank the settings against each other, in one run;
they are not a data centre's latencies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST, DatabaseSpec
from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.testing.servers.cassandra import CassandraCluster
from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter
from dbwrap_py.options import Options

#: (consistency, serial_consistency); ONE reads a single replica, so a plain
#: fetch may miss a write acknowledged at QUORUM: shown for its cost only
SETTINGS = (("QUORUM", "SERIAL"), ("LOCAL_QUORUM", "LOCAL_SERIAL"), ("ONE", "SERIAL"))


def timed(operation: Callable[[int], None], seconds: float) -> list[float]:
    """Latencies (ms) of ``operation(i)`` run back to back for ``seconds``."""
    latencies = []
    stop_at = time.monotonic() + seconds
    i = 0
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        operation(i)
        latencies.append((time.perf_counter() - started) * 1000)
        i += 1
    return latencies


Figures = tuple[float, float, float, float]  # ops/s, median ms, p99 ms, requests per op


def figures(latencies: list[float], seconds: float, requests: int) -> Figures:
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 100 else max(latencies)
    return len(latencies) / seconds, statistics.median(latencies), p99, requests / len(latencies)


def line(what: str, rounds: list[Figures]) -> str:
    rate, median, p99, requests = (statistics.median(r[i] for r in rounds) for i in range(4))
    return (f"{what:<14} {rate:5.0f}/s ({min(r[0] for r in rounds):.0f}-{max(r[0] for r in rounds):.0f})"
            f"  median {median:6.2f} ms  p99 {p99:6.2f} ms  requests/op {requests:.2f}")


def measure(cluster: CassandraCluster, consistency: str, serial: str, seconds: float) -> tuple[Figures, Figures]:
    options = {**cluster.options(), "consistency": consistency, "serial_consistency": serial}
    db = CassandraAdapter(DatabaseSpec(f"/dbwrap-py-bench/{consistency}.tdb", tdb_flags=TDB_CLEAR_IF_FIRST),
                          Options(options))
    try:
        keys = [b"key-%d" % i for i in range(200)]
        for key in keys:  # known values: a take is one round trip, as in a running smbd
            db.lock(key)
            db.put_unlock(key, b"v")
        before = db.client.requests
        locked = timed(lambda i: (db.lock(keys[i % 200]), db.put_unlock(keys[i % 200], b"v%d" % i)), seconds)
        locked_requests = db.client.requests - before
        before = db.client.requests
        fetched = timed(lambda i: db.get(keys[i % 200]), seconds)
        return (figures(locked, seconds, locked_requests),
                figures(fetched, seconds, db.client.requests - before))
    finally:
        db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="v1,v2")
    args = parser.parse_args()
    for variant in args.variants.split(","):
        with CassandraCluster(nodes=3, paxos_variant=variant) as cluster:
            measure(cluster, *SETTINGS[0], args.seconds)  # warms up the JVMs' JIT: not reported
            results: dict[tuple[str, str], list[tuple[Figures, Figures]]] = {s: [] for s in SETTINGS}
            for round_ in range(args.rounds):
                for setting in SETTINGS[round_ % len(SETTINGS):] + SETTINGS[:round_ % len(SETTINGS)]:
                    results[setting].append(measure(cluster, *setting, args.seconds))
            for (consistency, serial), rounds in results.items():
                print(f"paxos_variant {variant}, consistency {consistency}, serial_consistency {serial}:")
                print("  " + line("locked write", [r[0] for r in rounds]))
                print("  " + line("fetch", [r[1] for r in rounds]), flush=True)
            cc.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
