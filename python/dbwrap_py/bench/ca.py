"""Opens/s with persistent handles (Samba 4.25): a continuously available
share against a plain one, natively and through the bridge, in one run.

One smbd per backend, persistent handles on, two shares on one folder: the
test share is continuously available, "plain" is not. N client processes
each open a file of their own with a persistent handle asked for (SMB2
DH2Q, no oplock), and close it, for ``seconds``; on the CA share every open
and close stores the handle's records with DBWRAP_STORE_PERSISTENT, whose
durable copy is a transaction on the backend. On the plain share the same
request gets a durable-less open: the difference is what persistence costs.

The clients are Python (smbprotocol, dbwrap_py.testing.smb_client), on the
same 2 cores as smbd: they cap the absolute rates, the same for every
column. Ratios are what this measures.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from dbwrap_py.samba import SambaSetup, ThrowawaySamba
from dbwrap_py.smbtorture import PERSISTENT_SHARE, setup_for

PLAIN = "plain"


@dataclass
class Point:
    backend: str
    share: str  # "ca" or "plain"
    nprocs: int
    opens_per_second: float
    #: persistent handles granted, of the opens (all on ca, none on plain)
    persistent: int = 0
    opens: int = 0
    errors: list[str] = field(default_factory=list)


def with_plain_share(setup: SambaSetup) -> SambaSetup:
    """The persistent-handle setup plus a share that is not continuously available."""
    plain = {**PERSISTENT_SHARE, "continuous availability": "no"}
    return dataclasses.replace(setup, extra_shares={**setup.extra_shares, PLAIN: plain})


def client_loop(address: str, port: int, share: str | None, index: int, start_at: float, seconds: float,
                out: "multiprocessing.Queue[tuple[int, int, str]]") -> None:
    """One connection: open-close until ``seconds`` after ``start_at``;
    puts (opens, persistent handles granted, error or "") on ``out``."""
    from dbwrap_py.testing.smb_client import SmbClient

    opens = persistent = 0
    error = ""
    try:
        client = SmbClient(address, port, share=share)
        name = f"ca-bench-{index}.dat"
        time.sleep(max(0.0, start_at - time.time()))
        deadline = start_at + seconds
        while time.time() < deadline:
            handle = client.open_persistent(name, uuid.uuid4())
            persistent += handle.persistent
            handle.close()
            opens += 1
        client.close()
    except Exception as exc:  # the point reports it; one client's failure is not the run's
        error = f"client {index}: {type(exc).__name__}: {exc}"
    out.put((opens, persistent, error))


def measure(samba: ThrowawaySamba, backend: str, share: str, nprocs: int,
            seconds: float) -> Point:
    """N clients at once on ``share`` ("ca": the test share, or "plain")."""
    return run_clients(backend, share, ["127.0.0.1"], samba.port, PLAIN if share == "plain" else None,
                       nprocs, seconds)


def run_clients(backend: str, share: str, addresses: Sequence[str], port: int, share_name: str | None,
                nprocs: int, seconds: float) -> Point:
    """``nprocs`` clients at once, client i at addresses[i mod len]; every
    client process stopped by PID before this returns."""
    queue: multiprocessing.Queue = multiprocessing.Queue()
    start_at = time.time() + 2.0 + nprocs * 0.05  # every client connected first
    procs = [multiprocessing.Process(target=client_loop, daemon=True,
                                     args=(addresses[i % len(addresses)], port, share_name, i, start_at,
                                           seconds, queue))
             for i in range(nprocs)]
    for p in procs:
        p.start()
    point = Point(backend, share, nprocs, 0.0)
    limit = time.monotonic() + seconds + 60 + nprocs
    for _ in procs:
        try:
            opens, persistent, error = queue.get(timeout=max(1.0, limit - time.monotonic()))
        except Exception:
            point.errors.append("a client gave no result in time")
            break
        point.opens += opens
        point.persistent += persistent
        if error:
            point.errors.append(error)
    for p in procs:  # stopped by PID: a client past its time is killed
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    point.opens_per_second = point.opens / seconds
    return point


def sweep(backends: Sequence[tuple[str, SambaSetup]], nprocs: Sequence[int], seconds: float,
          report=print) -> list[Point]:
    """Every backend's smbd in turn; each count on the CA share, then plain."""
    points = []
    for label, setup in backends:
        with ThrowawaySamba(with_plain_share(setup)) as samba:
            for n in nprocs:
                for share in ("ca", "plain"):
                    point = measure(samba, label, share, n, seconds)
                    points.append(point)
                    report(point_line(point))
    return points


def point_line(p: Point) -> str:
    why = f"  ({p.errors[0]}{' ...' if len(p.errors) > 1 else ''})" if p.errors else ""
    return (f"  {p.backend:<24} {p.share:<5} nprocs={p.nprocs:<3} {p.opens_per_second:9.0f} opens/s"
            f"  persistent {p.persistent}/{p.opens}{why}")


def table(points: Sequence[Point]) -> list[str]:
    """Per backend and count: CA and plain opens/s, CA/plain, and each
    share's ratio to native's (the first backend)."""
    by = {(p.backend, p.share, p.nprocs): p for p in points}
    backends = list(dict.fromkeys(p.backend for p in points))
    counts = sorted({p.nprocs for p in points})
    native = backends[0]
    lines = [f"{'backend':<24} {'nprocs':>6} {'CA':>8} {'plain':>8} {'CA/plain':>9}"
             f" {'CA/native':>10} {'plain/native':>13}"]
    for b in backends:
        for n in counts:
            ca, plain = by.get((b, "ca", n)), by.get((b, "plain", n))
            if ca is None or plain is None:
                continue
            nca, npl = by.get((native, "ca", n)), by.get((native, "plain", n))

            def ratio(a: Point | None, z: Point | None) -> str:
                return f"{a.opens_per_second / z.opens_per_second:.2f}" if a and z and z.opens_per_second else "-"

            lines.append(f"{b:<24} {n:>6} {ca.opens_per_second:>8.0f} {plain.opens_per_second:>8.0f}"
                         f" {ratio(ca, plain):>9} {ratio(ca, nca):>10} {ratio(plain, npl):>13}")
    return lines


def native_setup() -> SambaSetup:
    return setup_for("native", persistent_handles=True)
