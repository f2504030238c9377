"""Which etcd client the etcd adapter should use: speed and memory per process.

Runs this project's hot path, one record lock cycle as do_locked does it
(lock_get, put_unlock) plus one read (get), on small values, against a
throwaway 1-member etcd, with:

  gateway  the etcd adapter itself: etcd's gRPC-JSON gateway over the adapter's
           own small HTTP/1.1 client (adapters/_etcd_client.py);
  grpc     etcd-sdk-python (``pyetcd``, gRPC) sending the same three requests:
           the same lock txn, the same fenced write-and-unlock txn, the same read.

Each run is a fresh process (so import costs show), alternating clients; the
table gives medians over the runs. Memory is /proc/self/smaps_rollup (Rss and
Pss) at three points: bare interpreter, after import, after the workload.

Usage: python bench/etcd_client_choice.py [--runs 3] [--cycles 500] [--json FILE]
(needs etcd on PATH; the grpc rows need ``pip install etcd-sdk-python
grpcio protobuf`` and are skipped without them)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


class GatewayClient:
    """The etcd adapter itself, opened as the bridge opens it; fork-safe by design."""

    name = "gateway"

    def __init__(self, endpoints: str) -> None:
        from dbwrap_py.database import open_database

        self.db = open_database(
            f"/bench/{os.getpid()}/client_choice.tdb", 0, 0, os.O_RDWR | os.O_CREAT, 0o600, 0, 0,
            "etcd", [f"endpoints={endpoints}"],
        )
        self.adapter = self.db.adapter

    def cycle(self, key: bytes) -> None:
        self.adapter.lock_get(key)
        self.adapter.put_unlock(key, VALUE)
        self.adapter.get(key)

    @property
    def round_trips(self) -> int:
        return self.adapter.round_trips


class GrpcClient:
    """pyetcd sending the adapter's three requests; one client per process, made lazily."""

    name = "grpc"

    def __init__(self, endpoints: str) -> None:
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "1")  # before grpc's import, or it is ignored
        import pyetcd

        from dbwrap_py.database import open_database  # noqa: F401  (same framework import as gateway)

        self.pyetcd = pyetcd
        self.host, port = endpoints.split(",")[0].split(":")
        self.port = int(port)
        self.pid = -1
        self.round_trips = 0

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
    parser.add_argument("--child", choices=("gateway", "grpc"), help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child, args.endpoints, args.cycles, args.forks)
        return 0

    from dbwrap_py.adapters._etcd_server import EtcdCluster

    kinds = ["gateway"] + (["grpc"] if have_pyetcd() else [])
    if "grpc" not in kinds:
        print("pyetcd not installed: grpc rows skipped", file=sys.stderr)
    raw: dict[str, list[dict]] = {k: [] for k in kinds}
    with EtcdCluster(nodes=1) as etcd:
        for _ in range(args.runs):
            for kind in kinds:  # alternate, so load drift hits both
                raw[kind].append(run_child(kind, etcd.endpoints, args.cycles, args.forks))
    summary = {k: summarize(v) for k, v in raw.items()}

    print(f"{args.runs} runs x {args.cycles} cycles of lock_get + put_unlock + get (64-byte values); medians.")
    print(f"'forked': {args.forks} children forked from the process after it used its client, all at once.")
    rows = [
        ("cycles/s, one process", lambda s: f"{s['cycles_per_s']:.0f} ({s['cycles_per_s_range'][0]:.0f}-{s['cycles_per_s_range'][1]:.0f})"),
        ("us per round trip", lambda s: f"{s['us_per_round_trip']:.0f}"),
        (f"cycles/s, {args.forks} forked together", lambda s: f"{s['forked_cycles_per_s']:.0f}"),
        ("import + open, ms", lambda s: f"{s['import_ms']:.0f}"),
        ("RSS bare / imported / used, MiB", lambda s: f"{s['rss_bare_mib']:.1f} / {s['rss_imported_mib']:.1f} / {s['rss_used_mib']:.1f}"),
        ("PSS used, MiB", lambda s: f"{s['pss_used_mib']:.1f}"),
        ("OS threads used", lambda s: f"{s['threads_used']:.0f}"),
        ("forked child private, MiB", lambda s: f"{s['child_private_mib']:.1f}"),
        ("forked child PSS, MiB", lambda s: f"{s['child_pss_mib']:.1f}"),
        ("forked child threads", lambda s: f"{s['child_threads']:.0f}"),
    ]
    print("| | " + " | ".join(summary) + " |")
    print("|---|" + "---|" * len(summary))
    for label, fmt in rows:
        print(f"| {label} | " + " | ".join(fmt(s) for s in summary.values()) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": raw}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
