"""Which etcd client the etcd adapter should use: speed and memory per process.

Runs this project's hot path, one record lock cycle as do_locked does it
(lock_get, put_unlock) plus one read (get), on small values, against a
throwaway 1-member etcd, with:

  gateway  the etcd adapter itself: etcd's gRPC-JSON gateway over the adapter's
           own small HTTP/1.1 client (adapters/etcd/client.py);
  grpc     etcd-sdk-python (``pyetcd``, gRPC) sending the same three requests:
           the same lock txn, the same fenced write-and-unlock txn, the same read.

Each run is a fresh process (so import costs show), alternating clients; the
table gives medians over the runs. Memory is /proc/self/smaps_rollup (Rss and
Pss) at three points: bare interpreter, after import, after the workload.

Daemon shape (``--daemon-threads 1,4,8,16``): the proxy daemon holds one
client for every smbd on the node, so its memory is paid once per node and
what matters is how it serves concurrent callers. One process, one client,
T threads each running the same cycle on keys of their own, T after T in the
same process; per T: cycles/s, median and p99 ms per cycle, and CPU per
cycle of this process and of etcd (the machine's cores are shared by both).
Memory, threads and sockets are taken once, after the last T. T=1 is the
daemon today (every adapter call on one adapter thread); more is what its
worker pool could do. The gateway client is not thread-safe (one keep-alive
HTTP/1.1 socket per session, and HTTP/1.1 carries one request at a time), so
with threads it gets what a thread-safe adapter would need: a pool of
connections, one per concurrent caller, behind the one session and lease.
gRPC shares one channel (one HTTP/2 connection, multiplexed) between threads.

Usage: python bench/etcd_client_choice.py [--runs 3] [--cycles 500] [--json FILE]
           [--daemon-threads 1,4,8,16 [--daemon-cycles 2000] [--daemon-only]]
(needs etcd on PATH; the grpc rows need ``pip install etcd-sdk-python
grpcio protobuf`` and are skipped without them)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VALUE = b"v" * 64


# -- the two clients, each run in a child process -------------------------------


def memory() -> dict[str, int]:
    """Rss, Pss and private (not shared with the fork parent) memory of this process, KiB."""
    fields = {"private": 0}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                fields[name.lower()] = int(rest.split()[0])
            elif name in ("Private_Clean", "Private_Dirty"):
                fields["private"] += int(rest.split()[0])
    with open("/proc/self/status") as f:  # OS threads, including grpc's C threads
        fields["threads"] = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return fields


def sockets() -> int:
    """Open sockets of this process: the client's connections (and etcd's none)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # the listing's own fd, gone by now
    return count


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PooledTransport:
    """Stands in for a session's _Transport so threads can share the adapter.

    _Transport is one keep-alive socket used without a lock: two threads on it
    interleave requests and read each other's replies (the proxy daemon
    funnels every adapter call through one thread for this reason). HTTP/1.1
    carries one request at a time per connection, so a thread-safe gateway
    client needs a connection per concurrent caller: this pool, which makes
    them as callers arrive and keeps them for the next.
    """

    def __init__(self, config: Any) -> None:
        from dbwrap_py.adapters.etcd.client import _Transport

        self._make = lambda: _Transport(config)
        self.config = config
        self._idle: list[Any] = []
        self._all: list[Any] = []
        self._mutex = threading.Lock()

    def _take(self) -> Any:
        with self._mutex:
            if self._idle:
                return self._idle.pop()
        transport = self._make()
        with self._mutex:
            self._all.append(transport)
        return transport

    def _give(self, transport: Any) -> None:
        with self._mutex:
            self._idle.append(transport)

    def call(self, path: str, body: Any, deadline: float, idempotent: bool) -> dict[str, Any]:
        transport = self._take()
        try:
            return transport.call(path, body, deadline, idempotent)
        finally:
            self._give(transport)

    def open_stream(self, path: str, body: Any, deadline: float) -> Any:
        transport = self._take()
        try:
            return transport.open_stream(path, body, deadline)
        finally:
            self._give(transport)

    def close(self) -> None:
        with self._mutex:
            for transport in self._all:
                transport.close()


class GatewayClient:
    """The etcd adapter itself, opened as the bridge opens it; fork-safe by design.

    With ``threads``, its session's transport becomes a PooledTransport. The
    adapter object is then shared by the threads as it is: its per-key state
    is a dict, which distinct keys do not race on (its round_trips counter
    does, so the daemon mode counts 3 per cycle itself).
    """

    name = "gateway"

    def __init__(self, endpoints: str, threads: bool = False) -> None:
        from dbwrap_py.database import open_database

        self.db = open_database(
            f"/bench/{os.getpid()}/client_choice.tdb", 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0,
            "etcd", [f"endpoints={endpoints}"],
        )
        self.adapter = self.db.adapter
        if threads:
            session = self.adapter._process()  # this process's session, made now
            session.transport.close()
            session.transport = PooledTransport(session.config)

    def cycle(self, key: bytes) -> None:
        self.adapter.lock_get(key)
        self.adapter.put_unlock(key, VALUE)
        self.adapter.get(key)

    @property
    def round_trips(self) -> int:
        return self.adapter.round_trips

    def close(self) -> None:
        self.db.close()


class GrpcClient:
    """pyetcd sending the adapter's three requests; one client per process, made lazily.

    With ``threads`` (the daemon shape): no fork support (the daemon never
    forks, and grpc's fork handlers cost), and a keepalive thread refreshing
    the lease every TTL/3 as the adapter's session does, since a daemon run
    outlasts the 10 s lease. One client, so one channel, shared by all threads.
    """

    name = "grpc"

    def __init__(self, endpoints: str, threads: bool = False) -> None:
        if not threads:
            os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "1")  # before grpc's import, or it is ignored
        import pyetcd

        from dbwrap_py.database import open_database  # noqa: F401  (same framework import as gateway)

        self.pyetcd = pyetcd
        self.host, port = endpoints.split(",")[0].split(":")
        self.port = int(port)
        self.pid = -1
        self.round_trips = 0
        self.threads = threads
        self._stop = threading.Event()

    def _process(self) -> None:
        if self.pid == os.getpid():
            return
        # never touch a client inherited through fork; time_retry=0: never
        # blacklist the endpoint after one error (see the etcd recipe)
        endpoint = self.pyetcd.Endpoint(self.host, self.port, secure=False, time_retry=0)
        self.client = self.pyetcd.MultiEndpointEtcd3Client(endpoints=[endpoint], timeout=10, failover=True)
        self.pid = os.getpid()
        self.owner = str(self.pid).encode()
        self.lease = self.client.lease(10)
        self.round_trips += 1
        if self.threads:
            threading.Thread(target=self._keepalive, name="grpc-lease-keepalive", daemon=True).start()

    def _keepalive(self) -> None:
        while not self._stop.wait(self.lease.ttl / 3):
            self.lease.refresh()

    def close(self) -> None:
        self._stop.set()
        if self.pid == os.getpid():
            self.client.close()

    def cycle(self, key: bytes) -> None:
        self._process()
        c, t = self.client, self.client.transactions
        base = f"/bench-grpc/{os.getpid()}/".encode()
        data, lock, seq = base + b"d/" + key, base + b"l/" + key, base + b"s"
        ok, responses = c.transaction(  # lock_get: create the lock key, read the record
            compare=[t.create(lock) == 0],
            success=[t.put(lock, self.owner, lease=self.lease), t.get(data)],
            failure=[t.get(lock)],
        )
        assert ok, "uncontended lock refused"
        revision = responses[0].response_put.header.revision
        ok, _ = c.transaction(  # put_unlock: fenced write, seqnum bump, unlock
            compare=[t.create(lock) == revision],
            success=[t.put(data, VALUE), t.put(seq, b""), t.delete(lock)],
            failure=[],
        )
        assert ok, "fenced write refused"
        c.get(data)  # get
        self.round_trips += 3


def timed(client, cycles: int) -> dict:
    start = time.perf_counter()
    before = client.round_trips
    key = f"bench-key-{os.getpid()}".encode()  # concurrent children must not contend
    for _ in range(cycles):
        client.cycle(key)
    elapsed = time.perf_counter() - start
    return {"cycles": cycles, "seconds": elapsed, "round_trips": client.round_trips - before,
            "memory": memory()}


def child_main(kind: str, endpoints: str, cycles: int, forks: int) -> None:
    """One process: import, use, then ``forks`` children at once, as smbd forks per client."""
    bare = memory()
    t0 = time.perf_counter()
    client = (GatewayClient if kind == "gateway" else GrpcClient)(endpoints)
    imported = memory()
    import_ms = (time.perf_counter() - t0) * 1000
    alone = timed(client, cycles)
    pipes = []
    for _ in range(forks):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: uses its own connection, reports its memory
            os.close(r)
            try:
                result = timed(client, cycles)
                os.write(w, json.dumps(result).encode())
            finally:
                os._exit(0)
        os.close(w)
        pipes.append((pid, r))
    children = []
    for pid, r in pipes:
        with os.fdopen(r) as f:
            children.append(json.loads(f.read()))
        os.waitpid(pid, 0)
    print(json.dumps({"client": kind, "import_ms": import_ms, "bare": bare, "imported": imported,
                      "alone": alone, "children": children}))


def print_table(summary: dict, rows: list) -> None:
    """A markdown table: a column per client, a row per (label, format)."""
    print("| | " + " | ".join(summary) + " |")
    print("|---|" + "---|" * len(summary))
    for label, fmt in rows:
        print(f"| {label} | " + " | ".join(fmt(s) for s in summary.values()) + " |")


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = math.ceil(fraction * len(sorted_values))
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


def daemon_phase(client: GatewayClient | GrpcClient, threads: int, cycles: int, warmup: int,
                 etcd_pid: int) -> dict:
    """``threads`` threads sharing ``client``, ``cycles`` cycles in all, each on its own key."""
    per_thread = max(1, cycles // threads)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    ends = [0.0] * threads
    errors: list[BaseException] = []
    marks: dict[str, float] = {}

    def start_clock() -> None:  # the barrier's action: run once, as every thread is ready
        marks["cpu"], marks["etcd_cpu"] = time.process_time(), cpu_seconds(etcd_pid)
        marks["start"] = time.perf_counter()

    barrier = threading.Barrier(threads + 1, action=start_clock)

    def worker(index: int) -> None:
        key = f"daemon-{threads}-{index}".encode()
        mine = latencies[index]
        try:
            for _ in range(warmup):  # a new thread's first calls make its connection (gateway)
                client.cycle(key)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        barrier.wait()
        try:
            for _ in range(per_thread):
                t0 = time.perf_counter()
                client.cycle(key)
                mine.append(time.perf_counter() - t0)
        except BaseException as exc:
            errors.append(exc)
        ends[index] = time.perf_counter()

    workers = [threading.Thread(target=worker, args=(i,), name=f"bench-{i}") for i in range(threads)]
    for w in workers:
        w.start()
    try:
        barrier.wait()
        running = memory()["threads"]  # while all T run: the client's own threads show here
    except threading.BrokenBarrierError:
        running = 0
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    elapsed = max(ends) - marks["start"]
    cpu, etcd_cpu = time.process_time() - marks["cpu"], cpu_seconds(etcd_pid) - marks["etcd_cpu"]
    done = per_thread * threads
    flat = sorted(x for mine in latencies for x in mine)
    return {"threads": threads, "cycles": done, "seconds": elapsed, "cycles_per_s": done / elapsed,
            "p50_ms": statistics.median(flat) * 1000, "p99_ms": percentile(flat, 0.99) * 1000,
            "cpu_us_per_cycle": cpu / done * 1e6, "etcd_cpu_us_per_cycle": etcd_cpu / done * 1e6,
            "threads_running": running}


def daemon_main(kind: str, endpoints: str, cycles: int, thread_counts: list[int], etcd_pid: int) -> None:
    """One process, one client, each T in turn: the proxy daemon's shape."""
    bare = memory()
    t0 = time.perf_counter()
    client = (GatewayClient if kind == "gateway" else GrpcClient)(endpoints, threads=True)
    client.cycle(b"daemon-setup")  # session, lease and keepalive thread (or channel and stubs) now
    import_ms = (time.perf_counter() - t0) * 1000
    phases = [daemon_phase(client, t, cycles, warmup=10, etcd_pid=etcd_pid) for t in thread_counts]
    used = memory()  # after the largest T, its threads gone: what the daemon keeps
    used["sockets"] = sockets()
    client.close()
    print(json.dumps({"client": kind, "import_ms": import_ms, "bare": bare, "used": used, "phases": phases}))


# -- the driver ---------------------------------------------------------------


def have_pyetcd() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import pyetcd"], capture_output=True)
    return probe.returncode == 0


def run_child(kind: str, endpoints: str, cycles: int, forks: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--endpoints", endpoints,
         "--cycles", str(cycles), "--forks", str(forks)],
        capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_daemon_child(kind: str, endpoints: str, cycles: int, thread_counts: list[int], etcd_pid: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--daemon-child", kind, "--endpoints", endpoints,
         "--daemon-cycles", str(cycles), "--daemon-threads", ",".join(map(str, thread_counts)),
         "--etcd-pid", str(etcd_pid)],
        capture_output=True, text=True, timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} daemon run failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize_daemon(runs: list[dict]) -> dict:
    med = statistics.median
    mib = 1 / 1024
    by_threads: dict[str, dict[str, float]] = {}
    for i, phase in enumerate(runs[0]["phases"]):
        mine = [r["phases"][i] for r in runs]
        rates = [p["cycles_per_s"] for p in mine]
        by_threads[str(phase["threads"])] = {
            "cycles_per_s": med(rates),
            "cycles_per_s_range": [min(rates), max(rates)],
            **{name: med(p[name] for p in mine)
               for name in ("p50_ms", "p99_ms", "cpu_us_per_cycle", "etcd_cpu_us_per_cycle", "threads_running")},
        }
    return {
        "runs": len(runs),
        "threads": by_threads,
        "setup_ms": med(r["import_ms"] for r in runs),
        "rss_used_mib": med(r["used"]["rss"] for r in runs) * mib,
        "pss_used_mib": med(r["used"]["pss"] for r in runs) * mib,
        "threads_used": med(r["used"]["threads"] for r in runs),
        "sockets_used": med(r["used"]["sockets"] for r in runs),
    }


def print_daemon_table(summary: dict[str, dict], thread_counts: list[int], runs: int, cycles: int) -> None:
    print()
    print(f"Daemon shape: one process, one client shared by T threads, {cycles} cycles per T "
          f"({runs} runs, medians).")
    rows: list[tuple[str, Callable[[dict], str]]] = []
    for t in thread_counts:
        k = str(t)
        rows += [
            (f"T={t}: cycles/s", lambda s, k=k: f"{s['threads'][k]['cycles_per_s']:.0f} "
             f"({s['threads'][k]['cycles_per_s_range'][0]:.0f}-{s['threads'][k]['cycles_per_s_range'][1]:.0f})"),
            (f"T={t}: ms per cycle, median / p99", lambda s, k=k: f"{s['threads'][k]['p50_ms']:.2f} / "
             f"{s['threads'][k]['p99_ms']:.2f}"),
            (f"T={t}: CPU us per cycle, client / etcd", lambda s, k=k: f"{s['threads'][k]['cpu_us_per_cycle']:.0f} / "
             f"{s['threads'][k]['etcd_cpu_us_per_cycle']:.0f}"),
        ]
    top = str(max(thread_counts))
    rows += [
        ("RSS / PSS after use, MiB", lambda s: f"{s['rss_used_mib']:.1f} / {s['pss_used_mib']:.1f}"),
        (f"OS threads after use (while T={top} ran)",
         lambda s: f"{s['threads_used']:.0f} ({s['threads'][top]['threads_running']:.0f})"),
        ("sockets after use", lambda s: f"{s['sockets_used']:.0f}"),
        ("setup (import, open, first cycle), ms", lambda s: f"{s['setup_ms']:.0f}"),
    ]
    print_table(summary, rows)


def summarize(runs: list[dict]) -> dict:
    med = statistics.median
    alone = [r["alone"]["cycles"] / r["alone"]["seconds"] for r in runs]
    together = [sum(c["cycles"] for c in r["children"]) / max(c["seconds"] for c in r["children"])
                for r in runs]
    mib = 1 / 1024
    return {
        "runs": len(runs),
        "cycles_per_s": med(alone),
        "cycles_per_s_range": [min(alone), max(alone)],
        "us_per_round_trip": med(r["alone"]["seconds"] / r["alone"]["round_trips"] * 1e6 for r in runs),
        "forked_cycles_per_s": med(together),
        "import_ms": med(r["import_ms"] for r in runs),
        "rss_bare_mib": med(r["bare"]["rss"] for r in runs) * mib,
        "rss_imported_mib": med(r["imported"]["rss"] for r in runs) * mib,
        "rss_used_mib": med(r["alone"]["memory"]["rss"] for r in runs) * mib,
        "pss_used_mib": med(r["alone"]["memory"]["pss"] for r in runs) * mib,
        "threads_used": med(r["alone"]["memory"]["threads"] for r in runs),
        "child_private_mib": med(c["memory"]["private"] for r in runs for c in r["children"]) * mib,
        "child_pss_mib": med(c["memory"]["pss"] for r in runs for c in r["children"]) * mib,
        "child_threads": med(c["memory"]["threads"] for r in runs for c in r["children"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--forks", type=int, default=4, help="children forked after the solo run")
    parser.add_argument("--json", help="write the raw runs and the summary here")
    parser.add_argument("--daemon-threads", type=thread_list, default=[],
                        help="also the daemon shape: one process, one client, these thread counts (e.g. 1,4,8,16)")
    parser.add_argument("--daemon-cycles", type=int, default=2000, help="cycles per thread count, all threads together")
    parser.add_argument("--daemon-only", action="store_true", help="skip the per-process runs")
    parser.add_argument("--child", choices=("gateway", "grpc"), help=argparse.SUPPRESS)
    parser.add_argument("--daemon-child", choices=("gateway", "grpc"), help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    parser.add_argument("--etcd-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child, args.endpoints, args.cycles, args.forks)
        return 0
    if args.daemon_child:
        daemon_main(args.daemon_child, args.endpoints, args.daemon_cycles, args.daemon_threads, args.etcd_pid)
        return 0
    if args.daemon_only and not args.daemon_threads:
        parser.error("--daemon-only needs --daemon-threads")

    from dbwrap_py.testing.servers.etcd import EtcdCluster

    kinds = ["gateway"] + (["grpc"] if have_pyetcd() else [])
    if "grpc" not in kinds:
        print("pyetcd not installed: grpc rows skipped", file=sys.stderr)
    raw: dict[str, list[dict]] = {k: [] for k in kinds}
    daemon_raw: dict[str, list[dict]] = {k: [] for k in kinds}
    with EtcdCluster(nodes=1) as etcd:  # stopped by PID, its directory removed, on the way out
        etcd_pid = etcd.pid(0)
        assert etcd_pid is not None
        for _ in range(args.runs):
            for kind in kinds:  # alternate, so load drift hits both
                if not args.daemon_only:
                    raw[kind].append(run_child(kind, etcd.endpoints, args.cycles, args.forks))
                if args.daemon_threads:
                    daemon_raw[kind].append(run_daemon_child(
                        kind, etcd.endpoints, args.daemon_cycles, args.daemon_threads, etcd_pid))
    report: dict[str, Any] = {}
    if not args.daemon_only:
        report.update(per_process_table(raw, args.runs, args.cycles, args.forks))
    if args.daemon_threads:
        daemon_summary = {k: summarize_daemon(v) for k, v in daemon_raw.items()}
        print_daemon_table(daemon_summary, args.daemon_threads, args.runs, args.daemon_cycles)
        report["daemon"] = {"summary": daemon_summary, "runs": daemon_raw}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def thread_list(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("thread counts are positive integers, comma separated")
    return counts


def per_process_table(raw: dict[str, list[dict]], runs: int, cycles: int, forks: int) -> dict[str, Any]:
    """Print the per-process table; the summary and the runs, for --json."""
    summary = {k: summarize(v) for k, v in raw.items()}
    print(f"{runs} runs x {cycles} cycles of lock_get + put_unlock + get (64-byte values); medians.")
    print(f"'forked': {forks} children forked from the process after it used its client, all at once.")
    rows = [
        ("cycles/s, one process", lambda s: f"{s['cycles_per_s']:.0f} ({s['cycles_per_s_range'][0]:.0f}-{s['cycles_per_s_range'][1]:.0f})"),
        ("us per round trip", lambda s: f"{s['us_per_round_trip']:.0f}"),
        (f"cycles/s, {forks} forked together", lambda s: f"{s['forked_cycles_per_s']:.0f}"),
        ("import + open, ms", lambda s: f"{s['import_ms']:.0f}"),
        ("RSS bare / imported / used, MiB", lambda s: f"{s['rss_bare_mib']:.1f} / {s['rss_imported_mib']:.1f} / {s['rss_used_mib']:.1f}"),
        ("PSS used, MiB", lambda s: f"{s['pss_used_mib']:.1f}"),
        ("OS threads used", lambda s: f"{s['threads_used']:.0f}"),
        ("forked child private, MiB", lambda s: f"{s['child_private_mib']:.1f}"),
        ("forked child PSS, MiB", lambda s: f"{s['child_pss_mib']:.1f}"),
        ("forked child threads", lambda s: f"{s['child_threads']:.0f}"),
    ]
    print_table(summary, rows)
    return {"summary": summary, "runs": raw}


if __name__ == "__main__":
    raise SystemExit(main())
