"""The node agent: one per node, like ctdbd, for any adapter with the node cache.

    dbwrap-py node-agent --adapter ADAPTER --cache-dir DIR [--node NAME] [-o K=V ...]
                         [--metrics-port [ADDR:]PORT] [--dwell SECONDS] [--idle SECONDS]

It holds the node lease (everything the node owns is held on it) and
publishes it to the node's processes in ``DIR/node.state``; serves release
requests from other nodes; hands back the records the node's processes
deleted, a few at a time; and on SIGTERM drains: processes take no new
records, it hands everything back, then revokes the lease.

A release request is served at once when no process of the node holds the
record. When one does, the agent marks the record wanted in the state file
and the process hands it over as it lets go: an agent that waited for the
chainlock itself would seldom get it while smbd's processes keep taking it.
Requests always go before the vacuum.

``NodeAgentProcess`` runs one as a child process (tests, benchmarks, the
throwaway servers of adapters), stopped by PID.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dbwrap_py.errors import ConfigError, DbwrapError, UnsafePath
from dbwrap_py.leased import renewal_timeout
from dbwrap_py.metrics import AGENT_METRICS_FILE, MetricsServer, agent_metrics_url, metrics_url, parse_listen
from dbwrap_py.nodecache.cache import NodeCache, check_cache_dir, local_files
from dbwrap_py.nodecache.layout import IN_STORE, VIA_BUCKET
from dbwrap_py.nodecache.protocol import NodeLease, NodeStore, Served
from dbwrap_py.nodecache.state import NodeState, StateWriter
from dbwrap_py.nodecache.sync import is_sync_key
from dbwrap_py.options import Options, Schema, is_secret
from dbwrap_py.safe_files import open_file, read_private_file, temp_file
from dbwrap_py.servers import ServerError, dying_with_parent, log_end

DEFAULT_TTL = 10
#: the file NodeAgentProcess gives its agent the options in (--options-file)
OPTIONS_FILE = "agent.options"
#: how often the records the node's processes deleted are handed back, and
#: how many that need a round trip in one go: requests wait at most for one
#: slice (records only this node had go without one, all of them)
VACUUM_SECONDS = 1.0
VACUUM_SLICE = 64
#: a request whose record is held locally is looked at again this often
RETRY_SECONDS = 0.005
#: the longest a requested record dwells on the node while its processes
#: use it: after this it goes as soon as nobody holds it, and one a process
#: holds is marked wanted (handed over as that process lets go). Meanwhile
#: the node's own processes use it: a hot record wanted by every node moves
#: once per dwell, not once per open (at 256 clients on three nodes it had
#: moved after nearly every open, each move tens of milliseconds)
HAND_OVER_DWELL = 0.2
#: a record the node does not use for this long (no process holds it and it
#: did not change) goes before its dwell is over: the node's processes may
#: be waiting for something another node's process holds, as a g_lock
IDLE_SECONDS = 0.005
#: a record asked for again within this long of the node's last hand-over of
#: it is hot: it dwells even while nobody here holds it. smbd's share-mode
#: records are g_locks: a process locks the record only to add or remove its
#: g_lock entry, and waits for the g_lock unlocked, so a hot record is mostly
#: free between two lock holds; handed over at once, it moved after every
#: hold (two per open), as ctdb's records would without its sticky pindown.
#: A record nobody asked for lately (a cold one) goes at once if it is free
HOT_SECONDS = 1.0
#: records remembered as handed over, before the ones no longer hot are dropped
HANDED_KEPT = 1024
#: how long a write-through for a traverse waits for records processes hold
SYNC_HOLD_SECONDS = 1.0
#: beyond the TTL, how long a stopping agent waits for its keepalive's call to the store
JOIN_SECONDS = 10.0
NODE_NAME_CHARS = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass
class Dwelling:
    """A release request the agent holds back: when it came in, and the
    record as last looked at (None: a process held it), and when."""

    since: float
    look: object = None
    looked_at: float = 0.0


def check_node_name(name: str) -> bytes:
    raw = name.encode()
    if not 1 <= len(raw) <= 64 or not set(raw) <= NODE_NAME_CHARS:
        raise ServerError(f"node name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return raw


def _log(text: str) -> None:
    print(f"node-agent[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


class NodeAgent:
    """The agent's work: ``start()``, then ``run()`` until ``stop()``."""

    def __init__(self, store: NodeStore, cache_dir: str | Path, node: str,
                 ttl: float = DEFAULT_TTL) -> None:
        self.store = store
        self.cache_dir = Path(cache_dir)
        self.node = check_node_name(node)
        self.ttl = ttl
        self.margin = min(1.0, ttl / 4)
        #: HAND_OVER_DWELL: the longest a record another node asked for stays while it is used here
        self.dwell = HAND_OVER_DWELL
        #: IDLE_SECONDS: a record unchanged and unheld this long goes before its dwell is over
        self.idle = IDLE_SECONDS
        self.lease = NodeLease(0, ttl)
        self._lease_until = 0.0  # a TTL after the store's last answer on it: it may hold it till then
        self._granted_at = 0.0  # when the grant was sent: the keepalives count from there
        self.served = self.vacuumed = self.written_through = 0
        #: keepalives answered, failed, and leases granted anew after one expired
        self.renewals = self.renewal_failures = self.regrants = 0
        #: told each answered keepalive's seconds (the metrics' histogram)
        self.renewal_observer: Callable[[float], None] | None = None
        #: told, for each release request served, the seconds since the agent
        #: took it in (the metrics' histogram: how long another node waited here)
        self.release_observer: Callable[[float], None] | None = None
        #: records and buckets owned at the last vacuum pass, counted only
        #: while metrics are served (count_owned)
        self.count_owned = False
        self.owned_records = self.owned_buckets = 0
        self._published_until = 0.0  # CLOCK_MONOTONIC: what the state file says
        #: requests held by a process of the node: when each was taken in
        self._pending: dict[tuple[bytes, bytes], Dwelling] = {}
        #: when the node last handed each record over (HOT_SECONDS)
        self._handed: dict[tuple[bytes, bytes], float] = {}
        self._metrics: MetricsServer | None = None
        self._stopping = threading.Event()
        self._released = threading.Event()  # after the drain: keepalives end
        self._mutex = threading.Lock()      # self.lease, between the keepalive thread and us
        self._requests: queue.Queue[tuple[bytes, bytes] | Served] = queue.Queue()
        self._caches: dict[bytes, NodeCache] = {}
        self._unreachable: set[bytes] = set()  # logged once, not every vacuum
        self._writer: StateWriter | None = None
        self._lockfile = -1
        self._keepalive_thread: threading.Thread | None = None

    # -- start and stop -----------------------------------------------------------

    def start(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        check_cache_dir(self.cache_dir)
        self._lockfile = open_file(self.cache_dir / "agent.lock", 0o600)
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerError(f"another node agent serves {self.cache_dir}") from None
        self._writer = StateWriter(self.cache_dir, self.node)
        self._grant()
        self._publish_metrics_address()
        self._keepalive_thread = threading.Thread(target=self._keepalive, name="keepalive", daemon=True)
        self._keepalive_thread.start()
        threading.Thread(target=self._listen, name="requests", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def serve_metrics(self, addr: str, port: int) -> tuple[str, int]:
        """Prometheus metrics at http://ADDR:PORT/metrics until the agent
        stops (metrics.py); where it listens. Before start(): a port that
        cannot be had stops the agent before it takes a lease."""
        from dbwrap_py.metrics import agent_registry, serve

        self.count_owned = True
        self._metrics = serve(agent_registry(self), addr, port)
        return self._metrics.address

    def _publish_metrics_address(self) -> None:
        """``agent.metrics`` in the cache directory: ``ADDR PORT``, for
        ``dbwrap-py status``; written whole, a link there replaced. Without
        metrics, a crashed agent's file goes."""
        if self._metrics is None:
            with suppress(FileNotFoundError):
                (self.cache_dir / AGENT_METRICS_FILE).unlink()
            return
        addr, port = self._metrics.address
        fd, temp = temp_file(self.cache_dir, f".{AGENT_METRICS_FILE}.", 0o644)
        try:
            with os.fdopen(fd, "w") as file:
                file.write(f"{addr} {port}\n")
            os.replace(temp, self.cache_dir / AGENT_METRICS_FILE)
        except BaseException:
            with suppress(FileNotFoundError):
                os.unlink(temp)
            raise

    def _stop_metrics(self) -> None:
        if self._metrics is None:
            return
        with suppress(FileNotFoundError):
            (self.cache_dir / AGENT_METRICS_FILE).unlink()
        self._metrics.close()
        self._metrics = None

    def pending_requests(self) -> int:
        """Release requests waiting: queued, or held by a process of the node."""
        return self._requests.qsize() + len(self._pending)

    def lease_valid_seconds(self) -> float:
        """For how long the published node lease is surely alive (0: not)."""
        return max(0.0, self._published_until - time.monotonic())

    def _publish(self, lease_id: int, valid_until: float) -> None:
        assert self._writer is not None
        self._writer.publish(lease_id, valid_until)
        self._published_until = valid_until

    def _current(self) -> NodeLease:
        with self._mutex:
            return self.lease

    def _grant(self) -> None:
        sent = time.monotonic()
        lease = self.store.grant(self.node, self.ttl)
        with self._mutex:
            self.lease = lease
        self._granted_at, self._lease_until = sent, time.monotonic() + lease.ttl
        self._publish(lease.id, sent + lease.ttl - self.margin)
        _log(f"node {self.node.decode()}, lease {lease.id:x}, ttl {lease.ttl:g} s, cache {self.cache_dir}")

    def _interval(self, granted: float) -> float:
        """Until the next keepalive: a third of the TTL, sooner where a grant
        is for less (cassandra: a whole second less), so that what it
        publishes (granted less the margin) never runs out between two."""
        return max(0.05, min(self.ttl / 3, (granted - self.margin) / 2))

    def _keepalive(self) -> None:
        interval = self._interval(self._current().ttl)
        wait = max(0.0, self._granted_at + interval - time.monotonic())  # the grant took a round trip or two
        while not self._released.wait(wait):  # through the drain too
            lease = self._current()
            sent = time.monotonic()
            try:
                ttl = self.store.keepalive(lease, renewal_timeout(interval, self._lease_until - sent))
                self.renewals += 1
                if self.renewal_observer is not None:
                    self.renewal_observer(time.monotonic() - sent)
                if ttl > 0:
                    self._lease_until = time.monotonic() + ttl
                    self._publish(lease.id, sent + ttl - self.margin)
                    interval = self._interval(ttl)
                elif not self._stopping.is_set():
                    _log(f"lease {lease.id:x} expired: the node's records are void; a new lease")
                    self.regrants += 1
                    self._grant()
                    interval = self._interval(self._current().ttl)
            except (DbwrapError, OSError) as exc:
                self.renewal_failures += 1
                _log(f"keepalive: {exc}")
                interval = max(0.05, self.ttl / 10)  # sooner while the store is away
            wait = max(0.0, sent + interval - time.monotonic())  # a slow answer is not added to it

    def _listen(self) -> None:
        while not self._stopping.is_set():
            try:
                for request in self.store.requests(self.node, self._stopping):
                    self._requests.put(request)
            except (DbwrapError, OSError) as exc:
                if not self._stopping.is_set():
                    _log(f"requests: {exc}; again")
                    time.sleep(0.1)

    def _join_keepalive(self) -> bool:
        """Wait for the keepalive thread to end (it stops on _released; a
        renewal in progress waits at most about a TTL); True if it still runs."""
        thread = self._keepalive_thread
        if thread is not None:
            thread.join(self.ttl + JOIN_SECONDS)
        return thread is not None and thread.is_alive()

    # -- the work -------------------------------------------------------------------

    def run(self) -> None:
        pending = self._pending  # held by a process of the node
        next_vacuum = time.monotonic() + VACUUM_SECONDS
        while not self._stopping.is_set():
            try:
                request = self._requests.get(timeout=RETRY_SECONDS if pending else 0.2)
            except queue.Empty:
                request = None
            now = time.monotonic()
            if isinstance(request, Served):
                self._served(request, pending)
            elif request is not None and request not in pending:
                # at once if nobody here holds it and it is not hot; else it dwells first
                if not self._hot(request, now) and self._serve(*request, want=self.dwell <= 0):
                    self._observe(request, now)
                else:
                    pending[request] = Dwelling(now, self._look(*request), now)
            for request, dwelling in list(pending.items()):
                if self._dwelt(request, dwelling) and self._serve(*request, want=self._over(dwelling)):
                    del pending[request]
                    self._observe(request, dwelling.since)
            if not pending and time.monotonic() >= next_vacuum and self._requests.empty():
                self._vacuum()
                next_vacuum = time.monotonic() + VACUUM_SECONDS
                assert self._writer is not None
                self._writer.clear_dead()  # nothing is wanted now
        self._drain()

    def _over(self, dwelling: Dwelling) -> bool:
        return time.monotonic() - dwelling.since >= self.dwell

    def _dwelt(self, request: tuple[bytes, bytes], dwelling: Dwelling) -> bool:
        """Whether the record may go now: its dwell is over, or nobody here
        used it for IDLE_SECONDS (looked at again after that long)."""
        if self._over(dwelling):
            return True
        now = time.monotonic()
        if now - dwelling.looked_at < self.idle:
            return False
        look = self._look(*request)
        if look is not None and look == dwelling.look:
            return True
        dwelling.look, dwelling.looked_at = look, now
        return False

    def _look(self, db_id: bytes, key: bytes) -> object:
        """The record as the node has it now, to compare (None while a process holds it)."""
        cache = self._cache_for(db_id)
        if cache is None:
            return ()
        return cache.look(key, self._current().id)

    def _hot(self, request: tuple[bytes, bytes], now: float) -> bool:
        """The record was handed over within HOT_SECONDS (and dwells, if the agent's dwell is on)."""
        return self.dwell > 0 and now - self._handed.get(request, -HOT_SECONDS) < HOT_SECONDS

    def _handed_over(self, request: tuple[bytes, bytes]) -> None:
        now = time.monotonic()
        if len(self._handed) >= HANDED_KEPT:
            self._handed = {r: at for r, at in self._handed.items() if now - at < HOT_SECONDS}
        self._handed[request] = now

    def _served(self, served: Served, pending: dict[tuple[bytes, bytes], float]) -> None:
        """A request this agent waits to serve is gone from the store: a
        process of the node handed the record over. Not wanted any more."""
        request = (served.db_id, served.key)
        dwelling = pending.pop(request, None)
        if dwelling is not None:
            assert self._writer is not None
            self._writer.unwant(*request)
            self.served += 1
            self._observe(request, dwelling.since)

    def _observe(self, request: tuple[bytes, bytes], taken_in: float) -> None:
        """A release request served: the record is hot for HOT_SECONDS, and
        how long the request waited here goes to the metrics."""
        if is_sync_key(request[1]):
            return
        self._handed_over(request)
        if self.release_observer is not None:
            self.release_observer(time.monotonic() - taken_in)  # as counted in served

    def _cache_for(self, db_id: bytes) -> NodeCache | None:
        cache = self._caches.get(db_id)
        if cache is None:
            if not local_files(self.cache_dir, db_id)[0].exists():
                return None  # no process of this node opened that database
            cache = self._caches[db_id] = NodeCache(self.cache_dir, db_id, self.store.database(db_id))
        return cache

    def _serve(self, db_id: bytes, key: bytes, want: bool = True) -> bool:
        """One release request; False while a process of the node holds the
        record, which is then marked wanted if ``want``."""
        if is_sync_key(key):
            self._write_through(db_id, key)
            return True
        lease = self._current()
        try:
            cache = self._cache_for(db_id)
            if cache is None:
                self.store.database(db_id).let_go(key, self.node, lease.id)
            elif not cache.serve_request(key, self.node, lease.id):
                # a process holds it: it hands it over as it lets go, and
                # the next try here finds it gone
                if want:
                    assert self._writer is not None
                    self._writer.want(db_id, key)
                return False
        except (DbwrapError, OSError) as exc:
            _log(f"release {key!r} of {db_id!r}: {exc}; again")
            return False
        assert self._writer is not None
        self._writer.unwant(db_id, key)
        self.served += 1
        return True

    def _write_through(self, db_id: bytes, key: bytes) -> None:
        """A traverse on another node asks for the node's records of a
        database (sync.py): write them through, then answer by removing the
        request. Tried once: a traverse waits only so long, and one that gets
        no answer says so."""
        started = time.monotonic()
        try:
            cache = self._cache_for(db_id)
            written = cache.write_through_owned(self._current().id, started + SYNC_HOLD_SECONDS) if cache else 0
            self.store.done(self.node, db_id, key)
        except (DbwrapError, OSError) as exc:
            _log(f"write-through of {db_id!r} for a traverse: {exc}; not answered")
            return
        self.written_through += written

    def _local_caches(self) -> list[NodeCache]:
        """Every database some process of this node opened through the cache."""
        found = []
        for path in sorted(self.cache_dir.glob("*.tdb")):
            if path.name.endswith(".buckets.tdb"):
                continue
            db_id = path.name[:-len(".tdb")].encode("utf-8", "surrogateescape")
            try:
                cache = self._cache_for(db_id)
            except (DbwrapError, OSError) as exc:  # e.g. its file went with a test's directory
                if db_id not in self._unreachable:
                    _log(f"database {db_id!r}: {exc}; its records here stay until it can be reached")
                    self._unreachable.add(db_id)
                continue
            self._unreachable.discard(db_id)
            if cache is not None:
                found.append(cache)
        return found

    def _vacuum(self) -> None:
        """Drop the deleted records only this node ever had (no round trip),
        and hand back a slice of those the store must hear of."""
        lease = self._current()
        budget = VACUUM_SLICE
        records = buckets = 0
        for cache in self._local_caches():
            try:
                found = cache.free_local_records(lease.id)[0]  # held ones next time
                if self.count_owned:
                    records += len(found)
                    buckets += len(cache.records.scan_buckets_free(lease.id))  # never waits
                for key, local in found:
                    if local.value is not None:
                        continue
                    if not self._requests.empty():
                        return  # requests first
                    local_only = local.via_bucket and not local.flags & IN_STORE
                    if not local_only and budget <= 0:
                        continue
                    if cache.hand_back(key, lease.id, self.node, wait=False, deleted_only=True):
                        self.vacuumed += 1
                        budget -= 0 if local_only else 1
            except (DbwrapError, OSError) as exc:
                _log(f"vacuum {cache.db_id!r}: {exc}")
        self.owned_records, self.owned_buckets = records, buckets  # a whole pass only

    # -- draining -------------------------------------------------------------------

    def _drain(self) -> None:
        """Hand back everything the node owns, then give up the lease."""
        assert self._writer is not None
        lease = self._current()
        self._writer.drain()  # processes take no new records; held ones finish
        records = buckets = 0
        for cache in self._local_caches():
            try:
                records += sum(cache.hand_back(key, lease.id, self.node, wait=True)
                               for key, local in cache.local_records(lease.id)
                               if not local.flags & VIA_BUCKET)
                buckets += cache.release_buckets(lease.id)
            except (DbwrapError, OSError) as exc:
                _log(f"drain {cache.db_id!r}: {exc}")
        self._released.set()
        renewing = self._join_keepalive()  # one still publishing would write the state file again
        self._stop_metrics()
        self._writer.remove()
        try:
            self.store.revoke(lease)
        except DbwrapError as exc:
            _log(f"revoke: {exc} (the lease expires by itself)")
        for cache in self._caches.values():
            cache.close()
        if renewing:
            _log("the keepalive is still in a call to the store: the store is left open for it")
        else:
            self.store.close()  # never under the keepalive's call; it ends the request thread's wait
        _log(f"stopped: {records} record(s) and {buckets} bucket(s) handed back; "
             f"{self.served} release request(s) served; {self.vacuumed} deleted record(s) vacuumed; "
             f"{self.written_through} record(s) written through for traverses")


class NodeAgentProcess:
    """``dbwrap-py node-agent`` as a child process, stopped by PID."""

    def __init__(self, adapter: str, options: Mapping[str, str], cache_dir: str | Path | None = None,
                 node: str = "node0", ttl: float | None = None, start_timeout: float = 15.0,
                 metrics_port: str | None = None, command_prefix: Sequence[str] = (),
                 dwell: float | None = None, idle: float | None = None) -> None:
        self.adapter = adapter
        #: the agent's --dwell and --idle (None: their defaults, HAND_OVER_DWELL and IDLE_SECONDS)
        self.dwell = dwell
        self.idle = idle
        #: what runs the agent elsewhere, and execs it (a node's namespace: ip netns exec)
        self.command_prefix = list(command_prefix)
        #: seconds start() waits for the agent's first lease (a store just
        #: started, such as three Cassandra nodes making their schema, is slow)
        self.start_timeout = start_timeout
        self.options = dict(options)
        self.node = node
        self.ttl = ttl
        #: the agent's --metrics-port ([ADDR:]PORT; "0": any free port); None: no metrics
        self.metrics_port = metrics_port
        self._own_dir = cache_dir is None
        self.cache_dir = Path(cache_dir) if cache_dir else Path(tempfile.mkdtemp(prefix="dbwrap-py-node-"))
        self.log = self.cache_dir / "agent.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "NodeAgentProcess":
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout: float | None = None) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        check_cache_dir(self.cache_dir)  # refused as it is, not repaired by the chmod
        self.cache_dir.chmod(0o755)  # mkdtemp made it 0700; smbd's processes read it as the user
        argv = [sys.executable, "-m", "dbwrap_py.nodecache.agent", "--adapter", self.adapter,
                "--cache-dir", str(self.cache_dir), "--node", self.node,
                *([f"--ttl={self.ttl:g}"] if self.ttl else []),
                *([f"--dwell={self.dwell:g}"] if self.dwell is not None else []),
                *([f"--idle={self.idle:g}"] if self.idle is not None else []),
                *(["--metrics-port", self.metrics_port] if self.metrics_port is not None else []),
                "--options-file", str(self._write_options_file())]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(dying_with_parent([*self.command_prefix, *argv]), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, start_new_session=True)
        state = NodeState(self.cache_dir)
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while not state.current()[0] or state.agent_pid() != self.process.pid:
                exited = self.process.poll()
                if exited is not None or time.monotonic() > deadline:
                    how = (f"it exited with status {exited}" if exited is not None else
                           f"no lease within {timeout:g} s; stopped")
                    if exited is None:
                        self.stop(signal.SIGKILL)
                    raise ServerError(f"node agent {self.node} did not come up ({how}); its log ends: "
                                      f"{log_end(self.log)}")
                time.sleep(0.02)
        finally:
            state.close()

    def metrics_url(self) -> str:
        """Where the running agent serves its metrics (its agent.metrics file)."""
        url = agent_metrics_url(self.cache_dir)
        if url is None:
            raise ServerError(f"node agent {self.node} serves no metrics (no --metrics-port)")
        return url

    def _write_options_file(self) -> Path:
        """The options in ``agent.options`` (0600) in the cache directory:
        never on the agent's argv, which /proc shows every user."""
        fd, temp = temp_file(self.cache_dir, ".agent.options.", 0o600)
        try:
            with os.fdopen(fd, "w") as file:
                file.write("".join(f"{k}={v}\n" for k, v in self.options.items()))
            path = self.cache_dir / OPTIONS_FILE
            os.replace(temp, path)  # a link there is replaced, not followed
        except BaseException:
            with suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        return path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM drains (hands back everything the node owns); SIGKILL is a crash."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.process = None


@contextmanager
def agent_beside(adapter: str, options: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """A throwaway node agent of ``adapter`` on the store ``options`` reach,
    when they ask for the node cache and name no cache directory (its node
    lease: the adapter's ``throwaway_agent_ttl``); yields what to add to the
    options, ``node_cache_dir``, or nothing. servers.backend_options puts
    it beside every throwaway store, so no adapter starts its own."""
    from dbwrap_py.nodecache.adapter import node_cache_mode, supports_node_cache
    from dbwrap_py.registry import find_adapter
    from dbwrap_py.testing.hooks import hooks_for

    cls = find_adapter(adapter)
    if node_cache_mode(Options(dict(options))) is None or options.get("node_cache_dir") \
            or not supports_node_cache(cls):  # its open refuses node_cache with the reason
        yield {}
        return
    ours = {k: v for k, v in options.items() if k in cls.option_names}
    with NodeAgentProcess(adapter, ours, ttl=hooks_for(adapter).throwaway_agent_ttl(ours)) as agent:
        yield {"node_cache_dir": str(agent.cache_dir)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dbwrap-py node-agent",
                                     description="the node agent of the node cache (node_cache = yes)")
    parser.add_argument("--adapter", required=True, help="the adapter whose store the node uses")
    parser.add_argument("--cache-dir", required=True, help="the databases' node_cache_dir")
    parser.add_argument("--node", default=socket.gethostname().split(".")[0],
                        help="this node's name, unique in the cluster (default: the host name)")
    parser.add_argument("--ttl", type=float, default=DEFAULT_TTL,
                        help="seconds the node lease lasts without a keepalive")
    parser.add_argument("--dwell", type=float, default=HAND_OVER_DWELL, metavar="SECONDS",
                        help="the longest a record another node asked for stays while the node's processes "
                             "hold it or, if it is hot, keep changing it (default "
                             f"{HAND_OVER_DWELL:g}; 0: handed over at the holder's unlock, a free one at once)")
    parser.add_argument("--idle", type=float, default=IDLE_SECONDS, metavar="SECONDS",
                        help="a record nobody here holds or changes for this long goes before its dwell "
                             f"is over (default {IDLE_SECONDS:g})")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                        help="adapter option, as smb.conf gives it (endpoints, TLS, ...); no secrets: "
                             "argv is public (/proc/PID/cmdline), use --options-file")
    parser.add_argument("--options-file", metavar="FILE",
                        help="adapter options, one K=V a line (# comments); mode 0600 if it holds a "
                             "password; -o options come after its")
    parser.add_argument("--metrics-port", metavar="[ADDR:]PORT",
                        help="serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR: 127.0.0.1 "
                             "unless given; 0: any free port); off without it")
    return parser


def read_options_file(path: str | Path, schema: Schema = ()) -> list[str]:
    """The ``K=V`` lines of ``path`` (blank lines and ``#`` comments
    skipped). Refused (UnsafePath), naming the file and its mode, as
    safe_files.read_private_file refuses a file that group or others may
    write, and when they may read it while it holds a secret."""
    try:
        data, mode = read_private_file(path, "--options-file", refused_bits=0o022)
    except OSError as exc:
        raise ConfigError(f"--options-file {str(path)!r}: {exc.strerror}") from None
    text = data.decode("utf-8")
    pairs = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    secret = [p.partition("=")[0].strip() for p in pairs if is_secret(p.partition("=")[0], schema)]
    if secret and mode & 0o044:
        raise UnsafePath(f"--options-file {str(path)!r} has mode {mode:04o} and holds {', '.join(secret)}: "
                         "readable by group or others; refused (chmod 0600)")
    return pairs


def refuse_secrets_on_argv(pairs: Sequence[str], schema: Schema = ()) -> None:
    """A secret given with -o is on the process's public argv: refused
    (``schema``: the adapter's options, whose secret flags count too)."""
    secret = sorted({p.partition("=")[0].strip().lower() for p in pairs
                     if is_secret(p.partition("=")[0], schema)})
    if secret:
        raise ConfigError(f"-o {', '.join(secret)}: a secret on the command line is public "
                          "(/proc/PID/cmdline); put it in --options-file FILE (mode 0600), or use "
                          "password_file")


def main(argv: Sequence[str] | None = None) -> int:
    from dbwrap_py.nodecache.adapter import supports_node_cache
    from dbwrap_py.registry import find_adapter

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cls = find_adapter(args.adapter)
        if not supports_node_cache(cls):
            raise ServerError(f"adapter {args.adapter!r} has no node cache (no node_store)")
        refuse_secrets_on_argv(args.option, cls.options_schema)
        from_file = read_options_file(args.options_file, cls.options_schema) if args.options_file else []
        options = Options.parse([*from_file, *args.option])
        listen = parse_listen(args.metrics_port) if args.metrics_port is not None else None
        if args.dwell < 0 or args.idle < 0:
            raise ServerError(f"--dwell {args.dwell:g}, --idle {args.idle:g}: seconds, 0 or more")
        agent = NodeAgent(cls.node_store(options), args.cache_dir, args.node, args.ttl)
        agent.dwell, agent.idle = args.dwell, args.idle
        if listen is not None:  # before the lease: a port it cannot have stops it first
            addr, port = agent.serve_metrics(*listen)
            _log(f"metrics on {metrics_url(addr, port)}")
        agent.start()
    except (DbwrapError, OSError, ServerError) as exc:
        print(f"dbwrap-py node-agent: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
