"""What the cassandra node agent's polling of release requests costs, per interval.

Cassandra has no watch, so an agent reads its node's partition of
``requests`` every ``request_poll`` seconds. For each interval this measures,
on a throwaway one-node Cassandra:

* hand-over latency: node a's agent owns a record (a process of node a took
  it); node b asks for it (``request_release``) and tries ``take`` every
  2 ms; the time from the request to b's successful take. It is the poll
  wait, the agent's write-back and b's take;
* idle load: the Cassandra JVM's CPU (utime + stime from /proc) over an idle
  window with the agent polling, against the same window with no agent, and
  the reads of ``requests`` Cassandra served in it (its virtual table
  ``system_views.local_read_latency``, where it has one).

Measured (2026-11-23, 2 cores shared with another Cassandra cluster, so
the CPU figures are noisy to a few points; 30 hand-overs each; a take of
a free record, one LWT, 1.6 to 3.6 ms):

    poll     JVM CPU (no agent: 11%)   reads/s   hand-over median / p90 / max
    10 ms    46% (+35)                 73        21 / 30 / 41 ms
    50 ms    19% (+8)                  19        53 / 68 / 174 ms
    200 ms    8% (within the noise)     5        124 / 211 / 297 ms

The default, 50 ms, costs Cassandra under a tenth of a core per node
agent and hands a record over in about a poll interval.

A measurement, not a test:

    .venv/bin/python bench/cassandra_request_poll.py [--intervals 0.01,0.05,0.2] [--handovers 20]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dbwrap_py.adapter import TDB_CLEAR_IF_FIRST
from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.testing.servers.cassandra import CassandraCluster
from dbwrap_py.adapters.cassandra.adapter import CassandraAdapter
from dbwrap_py.database import open_database
from dbwrap_py.errors import DbwrapError
from dbwrap_py.nodecache.agent import NodeAgentProcess
from dbwrap_py.nodecache.layout import bucket_of
from dbwrap_py.options import Options

IDLE_SECONDS = 6.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests_reads(client: cc.Client) -> int | None:
    """Local reads of the requests table so far, if Cassandra exposes the count."""
    try:
        rows = client.run("bench", "SELECT count FROM system_views.local_read_latency "
                          "WHERE keyspace_name = ? AND table_name = 'requests'", (client.config.keyspace,))
    except DbwrapError:
        return None
    return int(rows[0].count) if rows else 0


def idle(pid: int, client: cc.Client) -> tuple[float, int | None]:
    """JVM CPU seconds per second and requests reads per second over IDLE_SECONDS."""
    cpu, reads, start = cpu_seconds(pid), requests_reads(client), time.monotonic()
    time.sleep(IDLE_SECONDS)
    elapsed = time.monotonic() - start
    after = requests_reads(client)
    per_s = None if reads is None or after is None else round((after - reads) / elapsed)
    return (cpu_seconds(pid) - cpu) / elapsed, per_s


def handovers(options: dict[str, str], cache_dir: Path, name: str, count: int,
              interval: float) -> tuple[list[float], float]:
    """Seconds from node b's request to its take, ``count`` times; and the
    median seconds of one take of a free record (an LWT: the floor)."""
    opts = [f"{k}={v}" for k, v in {**options, "node_cache": "yes", "node_cache_dir": str(cache_dir)}.items()]
    on_a = open_database(name, 0, TDB_CLEAR_IF_FIRST, os.O_RDWR | os.O_CREAT, 0o600, 0, 0, "cassandra", opts)
    direct = CassandraAdapter(on_a.adapter.inner.spec, Options(options))  # b's ownership operations
    own = direct.ownership()
    store = CassandraAdapter.node_store(Options(options))
    lease_b = store.grant(b"b", 30)
    seconds = []
    try:
        for i in range(count):
            on_a.lock(b"hot")  # node a takes it (a record lock: b detached it from a's bucket)
            on_a.unlock(b"hot", b"%d" % i)
            time.sleep(random.uniform(0, interval))  # else each request lands at the same phase of the poll
            asked = time.monotonic()
            own.request_release(b"hot", b"a", lease_b.id)
            while True:
                try:
                    taken = own.take(b"hot", b"b", lease_b.id)
                    break
                except DbwrapError:
                    time.sleep(0.002)
            seconds.append(time.monotonic() - asked)
            assert taken.value == b"%d" % i, (taken, i)
            assert own.write_back(b"hot", taken.value, taken.token, False, b"b", lease_b.id)
        free = []
        for key in [k for k in (b"free-%d" % i for i in range(11)) if bucket_of(k) != bucket_of(b"hot")][:10]:
            started = time.monotonic()
            taken = own.take(key, b"b", lease_b.id)  # not in node a's bucket
            free.append(time.monotonic() - started)
            own.write_back(key, None, taken.token, False, b"b", lease_b.id)
    finally:
        store.revoke(lease_b)
        direct.close()
        on_a.close()
    return seconds, statistics.median(free)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intervals", default="0.01,0.05,0.2")
    parser.add_argument("--handovers", type=int, default=20)
    args = parser.parse_args(argv)
    with CassandraCluster(nodes=1) as cluster, tempfile.TemporaryDirectory(prefix="dbwrap-py-poll-") as tmp:
        pid = cluster.pid(0)
        assert pid is not None
        options = {**cluster.options(), "op_timeout": "5", "layout": "buckets"}
        probe = cc.Client(cc.ClientConfig.from_options(Options(options), 5.0))
        CassandraAdapter.node_store(Options(options))  # the schema, before anything is measured
        base_cpu, base_reads = idle(pid, probe)
        print(f"no agent:        JVM CPU {base_cpu * 100:5.1f}% of a core, requests reads/s {base_reads}")
        for interval in [float(x) for x in args.intervals.split(",")]:
            with NodeAgentProcess("cassandra", {**options, "request_poll": f"{interval:g}"},
                                  Path(tmp) / f"a-{interval:g}", node="a", ttl=3) as agent:
                cpu, reads = idle(pid, probe)
                took, lwt = handovers(options, agent.cache_dir,
                                      str(Path(tmp) / f"db-{interval:g}" / "locking.tdb"), args.handovers, interval)
            took_ms = sorted(t * 1000 for t in took)
            print(f"poll {interval * 1000:5.0f} ms: JVM CPU {cpu * 100:5.1f}% of a core "
                  f"(+{(cpu - base_cpu) * 100:4.1f}), requests reads/s {reads}; hand-over ms "
                  f"median {statistics.median(took_ms):6.1f}, p90 {took_ms[int(len(took_ms) * 0.9) - 1]:6.1f}, "
                  f"max {took_ms[-1]:6.1f} ({len(took_ms)} hand-overs); one take of a free record "
                  f"{lwt * 1000:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
