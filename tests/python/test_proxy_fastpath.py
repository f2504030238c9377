"""smbd's node cache fast path in proxy mode (proxy_fastpath = yes), through
the real C bridge: the conformance driver runs Samba's dbwrap front end on
the proxy transport against a real node daemon, node agent and
sqlite_leased store, and the daemon's request counts say which calls
crossed the socket.

Owned records must never cross it: with the fast path, no FETCH, LOCK,
UNLOCK, STORE, DELETE or EXISTS reaches the daemon, only the moves
(MOVE_IN) of records into the node. The same run without the option is
the counter's own check: there every record call crosses.
"""

from __future__ import annotations

from dbwrap_py.conformance import run_suite
from dbwrap_py.proxy.log import request_counts
from dbwrap_py.proxy.process import ProxyDaemonProcess

#: record checks with several processes, do_locked and fetch_locked, no traverse
CHECKS = ["kv.values", "kv.store-flags", "kv.missing", "lock.counter", "lock.counters",
          "lock.mixed", "lock.own-writes", "lock.release-on-kill", "db.fork"]
RECORD_OPS = ("FETCH", "LOCK", "UNLOCK", "STORE", "DELETE", "EXISTS")


def run_through_daemon(fastpath: bool) -> tuple[dict[str, int], object]:
    options = {"transport": "proxy", "node_cache": "yes", "lease": "2",
               "proxy_fastpath": "yes" if fastpath else "no"}
    with ProxyDaemonProcess() as daemon:
        run = run_suite("sqlite_leased", {**options, "proxy_socket": daemon.socket_path}, only=CHECKS)
        daemon.stop()  # its last line: the counts
        return request_counts(daemon.log.read_text()), run


def test_owned_records_never_cross_the_socket():
    counts, run = run_through_daemon(fastpath=True)
    failed = [f"{r.name}: {r.note}" for r in run.results if r.result != "pass"]
    assert not failed, "\n".join(failed) + "\n" + run.log
    assert counts.get("NODE_CACHE", 0) > 0 and counts.get("MOVE_IN", 0) > 0, counts
    assert {op: counts.get(op, 0) for op in RECORD_OPS} == dict.fromkeys(RECORD_OPS, 0), counts


def test_without_the_fast_path_every_record_call_crosses():
    counts, run = run_through_daemon(fastpath=False)
    assert all(r.result == "pass" for r in run.results), run.log
    assert counts.get("LOCK", 0) > 100 and counts.get("UNLOCK", 0) > 100, counts
    assert counts.get("NODE_CACHE", 0) == 0 and counts.get("MOVE_IN", 0) == 0, counts
