"""The etcd node agent: one per node, like ctdbd, for the etcd adapter's node cache.

    dbwrap-py etcd-agent --cache-dir DIR [--node NAME] -o endpoints=H:P [-o lease_ttl=N ...]

It holds the node lease (the lease every record the node owns is locked on),
publishes it to the node's processes in ``DIR/node.state``, and serves
release requests from other nodes: write the record back to etcd, delete the
node's lock key (one transaction, fenced on the key's create_revision), drop
the local copy. On SIGTERM it drains: processes take no new cached locks, it
writes back every record the node owns, then revokes the lease. The design is
in adapters/_etcd_node.py.

``NodeAgentProcess`` runs one as a child process (tests, benchmarks, the
throwaway server of ``node_cache=yes``), stopped by PID.
"""

from __future__ import annotations

import argparse
import fcntl
import json
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from dbwrap_py.adapter import TDB_SEQNUM, DatabaseSpec
from dbwrap_py.adapters._etcd_client import _b64, _Config, _prefix_end, _Transport, _unb64
from dbwrap_py.adapters._etcd_node import (
    CACHE_HASH_SIZE,
    StateWriter,
    cache_file,
    check_node_name,
    node_marker,
    nodes_prefix,
    request_prefix,
    unpack_record,
)
from dbwrap_py.adapters.tdb import TdbAdapter
from dbwrap_py.errors import DbwrapError
from dbwrap_py.options import Options
from dbwrap_py.servers import ServerError
from dbwrap_py.servers.etcd import _die_with_parent

DEFAULT_PREFIX = "dbwrap_py"
#: a request whose record is locked locally is tried again this often
RETRY_SECONDS = 0.001
#: how often deleted records the node owns are handed back (their lock keys
#: would otherwise pile up in etcd: smbd deletes a record on every close)
VACUUM_SECONDS = 2.0


def _log(text: str) -> None:
    print(f"etcd-agent[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


class NodeAgent:
    """The agent's work; ``run()`` until ``stop()`` (from a signal handler)."""

    def __init__(self, options: Mapping[str, str], cache_dir: str | Path, node: str) -> None:
        parsed = Options(dict(options))
        self.config = _Config.from_options(parsed)
        self.prefix = parsed.get_str("prefix", DEFAULT_PREFIX).strip("/").encode()
        self.node = check_node_name(node).encode()
        self.cache_dir = Path(cache_dir)
        self.margin = min(1.0, self.config.lease_ttl / 4)
        self.requests = request_prefix(self.prefix, self.node)
        self.lease_id = 0
        self.served = 0
        self.vacuumed = 0
        self._transport = _Transport(self.config)
        self._stopping = threading.Event()
        self._released = threading.Event()  # after the drain: keepalives end
        self._mutex = threading.Lock()  # lease_id, between the keepalive thread and us
        self._events: queue.Queue[bytes] = queue.Queue()
        self._caches: dict[bytes, TdbAdapter] = {}
        self._writer: StateWriter | None = None
        self._lockfile = -1
        self._watch_conn = None

    # -- start and stop -------------------------------------------------------

    def start(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o755)  # smbd's processes read it as the user
        self._lockfile = os.open(self.cache_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerError(f"another etcd node agent serves {self.cache_dir}") from None
        self._writer = StateWriter(self.cache_dir, self.node.decode())
        self._grant()
        threading.Thread(target=self._keepalive, name="keepalive", daemon=True).start()
        threading.Thread(target=self._watch, name="watch", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def _deadline(self) -> float:
        return time.monotonic() + self.config.op_timeout

    def _call(self, path: str, body: Mapping, idempotent: bool = True) -> dict:
        return self._transport.call(path, body, self._deadline(), idempotent)

    def _grant(self, transport: _Transport | None = None) -> None:
        """A new node lease, our registration on it, published to the node."""
        transport = transport or self._transport
        registration = nodes_prefix(self.prefix) + self.node
        deadline = self._deadline() + self.config.lease_ttl  # a dead predecessor's lease may linger
        sent = time.monotonic()
        reply = transport.call("/v3/lease/grant", {"TTL": str(self.config.lease_ttl)}, deadline, True)
        lease_id, ttl = int(reply["ID"]), int(reply.get("TTL", self.config.lease_ttl))
        put = {"request_put": {"key": _b64(registration), "value": _b64(b"%d" % os.getpid()),
                               "lease": str(lease_id)}}
        while True:
            reply = transport.call("/v3/kv/txn", {
                "compare": [{"key": _b64(registration), "target": "CREATE", "result": "EQUAL",
                             "create_revision": "0"}],
                "success": [put]}, deadline, True)
            if reply.get("succeeded"):
                break
            if time.monotonic() >= deadline:
                raise ServerError(f"node name {self.node.decode()!r} is registered by a live agent")
            time.sleep(0.2)
        with self._mutex:
            self.lease_id = lease_id
        assert self._writer is not None
        self._writer.publish(lease_id, sent + ttl - self.margin)
        _log(f"node {self.node.decode()}, lease {lease_id:x}, ttl {ttl} s, cache {self.cache_dir}")

    def _keepalive(self) -> None:
        transport = _Transport(self.config)
        interval = self.config.lease_ttl / 3
        while not self._released.wait(interval):  # through the drain too
            with self._mutex:
                lease_id = self.lease_id
            sent = time.monotonic()
            try:
                reply = transport.call("/v3/lease/keepalive", {"ID": str(lease_id)}, sent + interval, True)
                ttl = int(reply.get("result", {}).get("TTL", 0))
                if ttl > 0:
                    assert self._writer is not None
                    self._writer.publish(lease_id, sent + ttl - self.margin)
                    interval = self.config.lease_ttl / 3
                elif not self._stopping.is_set():
                    _log(f"lease {lease_id:x} expired: the node's cached records are void; new lease")
                    self._grant(transport)
            except (DbwrapError, OSError, KeyError, ValueError) as exc:
                _log(f"keepalive: {exc}")
                interval = max(0.05, self.config.lease_ttl / 10)  # retry sooner while etcd is away
        transport.close()

    # -- release requests -------------------------------------------------------

    def _watch(self) -> None:
        """Feed request keys to the main loop: the ones waiting, then new ones."""
        transport = _Transport(self.config)
        end = _prefix_end(self.requests)
        while not self._stopping.is_set():
            try:
                reply = transport.call("/v3/kv/range", {"key": _b64(self.requests), "range_end": _b64(end),
                                                        "keys_only": True}, self._deadline(), True)
                for kv in reply.get("kvs", []):
                    self._events.put(_unb64(kv["key"]))
                body = {"create_request": {"key": _b64(self.requests), "range_end": _b64(end),
                                           "start_revision": str(int(reply["header"]["revision"]) + 1),
                                           "filters": ["NODELETE"]}}
                conn = transport.open_stream("/v3/watch", body, self._deadline())
                self._watch_conn = conn
                conn.settimeout(None)  # stop() closes it
                pending = b""
                while not self._stopping.is_set():
                    chunk = conn.read_chunk()
                    if not chunk:
                        break
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        result = json.loads(line).get("result", {}) if line.strip() else {}
                        for event in result.get("events", []):
                            self._events.put(_unb64(event["kv"]["key"]))
                        if result.get("canceled"):
                            raise ConnectionError("watch canceled")
            except (DbwrapError, OSError, ValueError, KeyError) as exc:
                if not self._stopping.is_set():
                    _log(f"watch: {exc}; again")
                    time.sleep(0.1)

    def run(self) -> None:
        waiting: dict[bytes, None] = {}  # requests whose record is locked locally
        next_vacuum = time.monotonic() + VACUUM_SECONDS
        while not self._stopping.is_set():
            if time.monotonic() >= next_vacuum:
                self._vacuum()
                next_vacuum = time.monotonic() + VACUUM_SECONDS
            try:
                request = self._events.get(timeout=RETRY_SECONDS if waiting else 0.2)
                waiting[request] = None
            except queue.Empty:
                pass
            for request in list(waiting):
                try:
                    if self._serve(request):
                        del waiting[request]
                except (DbwrapError, OSError) as exc:
                    _log(f"release {request!r}: {exc}; again")
                    time.sleep(0.01)
        self._drain()

    def _serve(self, request: bytes) -> bool:
        """Write back and release the record ``request`` names; False: locked locally, later."""
        lock_key = request[len(self.requests):]
        parts = lock_key[len(self.prefix) + 1:].split(b"/l/", 1)
        if not lock_key.startswith(self.prefix + b"/") or len(parts) != 2:
            self._call("/v3/kv/deleterange", {"key": _b64(request)})
            return True
        db_base, key = parts
        local = self._cache_for(db_base)
        if local is not None and not local.try_lock(key):
            return False
        try:
            record = local.get(key) if local is not None else None
            with self._mutex:
                lease_id = self.lease_id
            if record is not None and unpack_record(record)[0] == lease_id:
                self._write_back(db_base, key, record, request)
                local.remove(key)
            else:
                self._release_orphan(lock_key, lease_id, request)
        finally:
            if local is not None:
                local.unlock(key)
        self.served += 1
        return True

    def _write_back(self, db_base: bytes, key: bytes, record: bytes, request: bytes | None) -> bool:
        """Record to etcd and lock key gone, in one txn fenced on our ownership."""
        _, revision, value = unpack_record(record)
        base = self.prefix + b"/" + db_base + b"/"
        lock_key = base + b"l/" + key
        data = {"key": _b64(base + b"d/" + key)}
        ops = [{"request_delete_range": data} if value is None
               else {"request_put": {**data, "value": _b64(value)}},
               {"request_put": {"key": _b64(base + b"s")}},
               {"request_delete_range": {"key": _b64(lock_key)}}]
        cleanup = [{"request_delete_range": {"key": _b64(request)}}] if request else []
        reply = self._call("/v3/kv/txn", {
            "compare": [{"key": _b64(lock_key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(revision)}],
            "success": ops + cleanup, "failure": cleanup}, idempotent=True)
        return bool(reply.get("succeeded"))

    def _release_orphan(self, lock_key: bytes, lease_id: int, request: bytes) -> None:
        """Our lock key with no local copy behind it (a process died mid-migration):
        etcd's record is current, so just let the key go."""
        cleanup = {"request_delete_range": {"key": _b64(request)}}
        reply = self._call("/v3/kv/range", {"key": _b64(lock_key)})
        kvs = reply.get("kvs")
        if kvs and _unb64(kvs[0].get("value")) == node_marker(self.node, lease_id):
            self._call("/v3/kv/txn", {
                "compare": [{"key": _b64(lock_key), "target": "CREATE", "result": "EQUAL",
                             "create_revision": kvs[0]["create_revision"]}],
                "success": [{"request_delete_range": {"key": _b64(lock_key)}}, cleanup],
                "failure": [cleanup]})
        else:
            self._call("/v3/kv/txn", {"success": [cleanup]})

    def _cache_for(self, db_base: bytes) -> TdbAdapter | None:
        local = self._caches.get(db_base)
        if local is not None:
            return local
        path = cache_file(self.cache_dir, db_base)
        if not path.exists():
            return None  # no process of this node opened that database
        spec = DatabaseSpec(name=str(path), hash_size=CACHE_HASH_SIZE, tdb_flags=TDB_SEQNUM,
                            open_flags=os.O_RDWR, mode=0o600)
        local = self._caches[db_base] = TdbAdapter(spec, Options({"native_records": "no"}))
        return local

    def _vacuum(self) -> None:
        """Hand deleted records back: lock key and etcd record gone, local tombstone too."""
        with self._mutex:
            lease_id = self.lease_id
        for db_base, local in self._local_caches():
            try:
                for key in _owned_keys(local, lease_id, deleted_only=True):
                    # a record in use is left for the next pass
                    self.vacuumed += self._hand_back(db_base, local, key, lease_id, wait=False,
                                                     deleted_only=True)
            except (DbwrapError, OSError) as exc:
                _log(f"vacuum {db_base!r}: {exc}")

    def _hand_back(self, db_base: bytes, local: TdbAdapter, key: bytes, lease_id: int,
                   wait: bool, deleted_only: bool = False) -> bool:
        """Write one record we own back to etcd and drop our copy, under its
        local lock; False if it is locked (without ``wait``) or no longer ours."""
        if wait:
            local.lock(key)
        elif not local.try_lock(key):
            return False
        try:
            record = local.get(key)
            if record is None:
                return False
            owner, _, value = unpack_record(record)
            if owner != lease_id or (deleted_only and value is not None):
                return False
            written = self._write_back(db_base, key, record, None)
            local.remove(key)
            return written
        finally:
            local.unlock(key)

    def _local_caches(self) -> list[tuple[bytes, TdbAdapter]]:
        """Every database some process of this node has opened through the cache."""
        found = []
        for path in sorted(self.cache_dir.glob("*.tdb")):
            db_base = path.name[:-len(".tdb")].encode("utf-8", "surrogateescape")
            local = self._cache_for(db_base)
            if local is not None:
                found.append((db_base, local))
        return found

    # -- draining ---------------------------------------------------------------

    def _drain(self) -> None:
        """Write back everything the node owns, then give up the lease."""
        assert self._writer is not None
        with self._mutex:
            lease_id = self.lease_id
        self._writer.drain()
        conn = self._watch_conn
        if conn is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        written = 0
        for _ in range(3):  # a process that saw the lease live just before may still migrate one in
            found = 0
            for db_base, local in self._local_caches():
                for key in _owned_keys(local, lease_id):
                    found += 1
                    try:
                        written += self._hand_back(db_base, local, key, lease_id, wait=True)
                    except (DbwrapError, OSError) as exc:
                        _log(f"drain {key!r}: {exc}")
            if not found:
                break
        self._released.set()
        self._writer.remove()
        try:
            self._call("/v3/lease/revoke", {"ID": str(lease_id)})
        except DbwrapError as exc:
            _log(f"revoke: {exc} (the lease expires by itself)")
        for local in self._caches.values():
            local.close()
        _log(f"stopped: {written} record(s) written back, {self.served} release request(s) served, "
             f"{self.vacuumed} deleted record(s) vacuumed")


def _owned_keys(local: TdbAdapter, lease_id: int, deleted_only: bool = False) -> list[bytes]:
    """The keys of ``local``'s records owned under ``lease_id`` (only deleted ones)."""
    keys = []
    for key, record in local.scan():
        owner, _, value = unpack_record(record)
        if owner == lease_id and (value is None or not deleted_only):
            keys.append(key)
    return keys


class NodeAgentProcess:
    """``dbwrap-py etcd-agent`` as a child process, stopped by PID."""

    #: adapter options the agent needs as well
    passed_options = ("endpoints", "prefix", "lease_ttl", "op_timeout", "ca_file", "cert_file",
                      "key_file", "user", "password")

    def __init__(self, options: Mapping[str, str], cache_dir: str | Path | None = None,
                 node: str = "node0") -> None:
        self.options = {k: v for k, v in options.items() if k in self.passed_options}
        self.node = node
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

    def start(self, timeout: float = 15.0) -> None:
        from dbwrap_py.adapters._etcd_node import NodeState

        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.cache_dir.chmod(0o755)  # mkdtemp made it 0700
        argv = [sys.executable, "-m", "dbwrap_py.servers.etcd_agent", "--cache-dir", str(self.cache_dir),
                "--node", self.node, *[f"-o{k}={v}" for k, v in self.options.items()]]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        state = NodeState(self.cache_dir)
        deadline = time.monotonic() + timeout
        try:
            while not state.current()[0] or state.agent_pid() != self.process.pid:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    tail = self.log.read_text(errors="replace")[-800:]
                    raise ServerError(f"etcd node agent did not come up: {tail}")
                time.sleep(0.02)
        finally:
            state.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM drains (writes back every owned record); SIGKILL is a crash."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.process = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbwrap-py etcd-agent",
                                     description="the etcd adapter's node agent (node_cache = yes)")
    parser.add_argument("--cache-dir", required=True, help="the adapter's node_cache_dir")
    parser.add_argument("--node", default=socket.gethostname().split(".")[0],
                        help="this node's name, unique in the cluster (default: the host name)")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="K=V",
                        help="etcd option as for the adapter: endpoints, prefix, lease_ttl, op_timeout, TLS, user")
    args = parser.parse_args(argv)
    try:
        options = dict(Options.parse(args.option))
        agent = NodeAgent(options, args.cache_dir, args.node)
        agent.start()
    except (DbwrapError, OSError, ServerError) as exc:
        print(f"dbwrap-py etcd-agent: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
