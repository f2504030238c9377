"""A throwaway etcd cluster (1 or 3 members) on 127.0.0.1, for tests and benchmarks.

    with EtcdCluster(nodes=3) as etcd:
        etcd.endpoints            # "127.0.0.1:p0,127.0.0.1:p1,127.0.0.1:p2"
        etcd.stop_member(0)       # SIGKILL by PID
        etcd.start_member(0)      # same data dir, --initial-cluster-state existing

    pki = make_pki(tmp_path)      # dbwrap_py.servers.tls: CA, server and client certificates
    with EtcdCluster(tls=EtcdTls(pki.server.cert, pki.server.key)) as etcd:
        etcd.endpoints            # "https://127.0.0.1:p0" (the peer URLs stay http)
        etcd.enable_auth("pw")    # user "root"; etcd.gateway() then logs in as root
        etcd.add_user("smbd", "pw2", key_prefix="dbwrap_py/")

Settings chosen for tests: 10 ms heartbeats and 100 ms elections (a fresh
member is healthy in ~0.1 s, and the minimum lease TTL drops from 2 s to 1 s),
auto-compaction by revision (a long benchmark does not grow without bound),
and a large --max-txn-ops, so dbwrap transactions of many records fit in one
etcd transaction; --bcrypt-cost 4 (the lowest: a password login takes ~3 ms
instead of ~70 ms, and it matters only once auth is on). Logs go to files next
to the data directories, and every member dies with the process that started
it (PR_SET_PDEATHSIG), so an interrupted test run leaves no server behind.

``main(argv)`` runs one cluster in the foreground until SIGTERM or SIGINT
(``python -m dbwrap_py.testing.servers.etcd --nodes 3``; ``dbwrap-py server
etcd`` runs a one-member one the way the tests do).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from dbwrap_py.servers import ServerError, dying_with_parent, pause_process, serve_until_stopped
from dbwrap_py.testing.servers import log_tails
from dbwrap_py.testing.hooks import TestHooks

HOST = "127.0.0.1"
#: how many revisions auto-compaction keeps (a paged scan pins one revision)
COMPACTION_RETENTION = 10000
MAX_TXN_OPS = 4096
BCRYPT_COST = 4

def _free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports that were free a moment ago (the caller retries on a race)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


#: the throwaway clusters running in this process, by their endpoints (for
#: diagnostics: a failed soak shows their logs)
RUNNING: dict[str, "EtcdCluster"] = {}


class EtcdError(ServerError):
    """The throwaway etcd could not be started."""


@dataclasses.dataclass(frozen=True)
class EtcdTls:
    """TLS on the client URLs (https); the peer URLs stay plain http.

    ``cert_file``/``key_file`` are the server's pair (a SAN of IP:127.0.0.1).
    With ``client_cert_auth``, etcd takes only clients whose certificate
    chains to ``trusted_ca_file``. etcd's own JSON gateway then connects to its
    gRPC server with ``cert_file``, and so do this class's health checks and
    gateway calls: that certificate must allow client authentication too,
    and once auth is on (enable_auth) it must have no CommonName, like any
    certificate a client of etcd 3.4's gateway presents under
    client_cert_auth (``tls.make_pki``'s server and client certificates
    are so).
    """

    cert_file: Path
    key_file: Path
    trusted_ca_file: Path | None = None
    client_cert_auth: bool = False

    def __post_init__(self) -> None:
        if self.client_cert_auth and self.trusted_ca_file is None:
            raise ValueError("client_cert_auth needs trusted_ca_file")

    def etcd_flags(self) -> list[str]:
        flags = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file)]
        if self.trusted_ca_file is not None:
            flags += ["--trusted-ca-file", str(self.trusted_ca_file)]
        if self.client_cert_auth:
            flags.append("--client-cert-auth")
        return flags

    def own_context(self) -> ssl.SSLContext:
        """For the cluster's own requests to its members: no server
        verification (it is our child on 127.0.0.1), the server's pair as
        client certificate under client_cert_auth."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if self.client_cert_auth:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


class _Member:
    def __init__(self, index: int, root: Path, client_port: int, peer_port: int, scheme: str = "http",
                 host: str = HOST) -> None:
        self.name = f"m{index}"
        self.host = host
        self.scheme = scheme
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = root / f"{self.name}.etcd"
        self.log = root / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


class EtcdCluster:
    """``nodes`` etcd members on free ports of 127.0.0.1, in a temporary directory.

    With ``tls``, the client URLs are https (see EtcdTls). ``auth_token_ttl``
    (seconds) is etcd's --auth-token-ttl: how long an unused simple token
    lives once auth is on (enable_auth). ``host``: the address the members
    listen on (a cluster in network namespaces reaches its bridge's, not
    127.0.0.1; the TLS certificates name 127.0.0.1 only).
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        heartbeat_ms: int = 10,
        election_ms: int = 100,
        etcd_binary: str | None = None,
        start_timeout: float = 30.0,
        tls: EtcdTls | None = None,
        auth_token_ttl: int | None = None,
        host: str = HOST,
    ) -> None:
        if nodes < 1:
            raise ValueError("an etcd cluster needs at least one member")
        binary = etcd_binary or shutil.which("etcd")
        if binary is None:
            raise EtcdError("no etcd binary on PATH (Debian: apt-get install etcd-server)")
        self.nodes = nodes
        self.host = host
        self.binary = binary
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.start_timeout = start_timeout
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self._context = tls.own_context() if tls is not None else None
        #: (user, password) gateway() logs in with, once enable_auth() turned auth on
        self._credentials: tuple[str, str] | None = None
        self.root: Path | None = None
        self._members: list[_Member] = []
        self._token = f"dbwrap-py-{uuid.uuid4().hex[:12]}"

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> "EtcdCluster":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every member and wait until all report healthy."""
        last_error: Exception | None = None
        for _ in range(3):  # a port taken between _free_ports and etcd's bind: try new ones
            self.root = Path(tempfile.mkdtemp(prefix="dbwrap-py-etcd-"))
            ports = _free_ports(2 * self.nodes, self.host)
            scheme = "https" if self.tls is not None else "http"
            self._members = [
                _Member(i, self.root, ports[2 * i], ports[2 * i + 1], scheme, self.host) for i in range(self.nodes)
            ]
            self._credentials = None
            try:
                for i in range(self.nodes):
                    self._spawn(i, state="new")
                self.wait_healthy()
                RUNNING[self.endpoints] = self
                return
            except EtcdError as exc:
                last_error = exc
                logs = self.log_tail()
                self.stop()
                if "address already in use" not in logs:
                    raise EtcdError(f"{exc}\n{logs}") from None
        raise EtcdError(f"etcd did not start: {last_error}")

    def stop(self) -> None:
        """Stop every member by PID, then remove the temporary directory."""
        if self._members:
            RUNNING.pop(self.endpoints, None)
        for i in range(len(self._members)):
            self._terminate(i)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- what tests use -----------------------------------------------------

    @property
    def endpoints(self) -> str:
        """``host:port`` of every member's client URL, comma separated
        (``https://host:port`` with TLS)."""
        return ",".join(self.member_endpoint(i) for i in range(len(self._members)))

    def member_endpoint(self, index: int) -> str:
        member = self._members[index]
        return member.client_url if self.tls is not None else f"{self.host}:{member.client_port}"

    # -- auth -----------------------------------------------------------------

    def enable_auth(self, root_password: str) -> None:
        """Create the ``root`` user (root role) and turn etcd's auth on.

        Afterwards every client must log in; gateway() does, as root.
        """
        self.gateway("/v3/auth/role/add", {"name": "root"})
        self.gateway("/v3/auth/user/add", {"name": "root", "password": root_password})
        self.gateway("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self.gateway("/v3/auth/enable", {})
        self._credentials = ("root", root_password)

    def add_user(self, name: str, password: str, key_prefix: str | None = None) -> None:
        """A user with the root role, or with ``key_prefix`` only (read and
        write on every key starting with it, through a role of the same name)."""
        self.gateway("/v3/auth/user/add", {"name": name, "password": password})
        role = "root"
        if key_prefix is not None:
            role = name
            prefix = key_prefix.encode()
            end = prefix[:-1] + bytes([prefix[-1] + 1])
            self.gateway("/v3/auth/role/add", {"name": role})
            perm = {"permType": "READWRITE", "key": _b64(prefix), "range_end": _b64(end)}
            self.gateway("/v3/auth/role/grant", {"name": role, "perm": perm})
        self.gateway("/v3/auth/user/grant", {"user": name, "role": role})

    def change_password(self, name: str, password: str) -> None:
        """etcd drops the user's tokens, even when ``password`` is the old one."""
        self.gateway("/v3/auth/user/changepw", {"name": name, "password": password})

    def gateway(self, path: str, body: Mapping[str, Any], index: int = 0) -> dict[str, Any]:
        """One request to member ``index``'s JSON gateway (as root once
        enable_auth() ran); EtcdError for an error reply."""
        headers = {"Content-Type": "application/json"}
        if self._credentials is not None:
            user, password = self._credentials
            reply = self._post(index, "/v3/auth/authenticate", {"name": user, "password": password}, headers)
            headers["Authorization"] = reply["token"]
        return self._post(index, path, body, headers)

    def pid(self, index: int) -> int | None:
        process = self._members[index].process
        return process.pid if process is not None and process.poll() is None else None

    def stop_member(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one member by PID (SIGKILL by default: a crash, not a clean leave)."""
        process = self._members[index].process
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, sig)
            if sig in (signal.SIGTERM, signal.SIGINT):
                os.kill(process.pid, signal.SIGCONT)
        process.wait(timeout=30)
        self._members[index].process = None

    def pause_member(self, index: int) -> None:
        """SIGSTOP one member: it keeps its sockets but answers nothing."""
        pid = self.pid(index)
        if pid is not None:
            pause_process(pid)

    def resume_member(self, index: int) -> None:
        pid = self.pid(index)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def start_member(self, index: int, wait: bool = True) -> None:
        """Restart a stopped member on its old data directory.

        With ``wait``, return once it is healthy, which needs a quorum: when
        restarting a majority, start all but the last with ``wait=False``.
        """
        if self._members[index].process is not None:
            raise EtcdError(f"member {index} is running")
        self._spawn(index, state="existing")
        if wait:
            self.wait_healthy([index])

    def wait_healthy(self, members: Sequence[int] | None = None, timeout: float | None = None) -> None:
        """Wait until each of ``members`` (default: all) says /health is true."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.start_timeout)
        for index in range(len(self._members)) if members is None else members:
            member = self._members[index]
            while not self._healthy(member):
                if member.process is None or member.process.poll() is not None:
                    raise EtcdError(f"etcd member {member.name} exited")
                if time.monotonic() > deadline:
                    raise EtcdError(f"etcd member {member.name} not healthy in time")
                time.sleep(0.01)

    def log_tail(self, lines: int = 20) -> str:
        return log_tails(((member.name, member.log) for member in self._members), lines)

    # -- internals ----------------------------------------------------------

    def _spawn(self, index: int, state: str) -> None:
        member = self._members[index]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self._members)
        argv = [
            self.binary,
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial,
            "--initial-cluster-state", state,
            "--initial-cluster-token", self._token,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", str(COMPACTION_RETENTION),
            "--max-txn-ops", str(MAX_TXN_OPS),
            "--logger", "zap",
            "--log-outputs", str(member.log),
            "--log-level", "warn",
            "--bcrypt-cost", str(BCRYPT_COST),
        ]
        if self.tls is not None:
            argv += self.tls.etcd_flags()
        if self.auth_token_ttl is not None:
            argv += ["--auth-token-ttl", str(self.auth_token_ttl)]
        with open(member.log, "ab") as log:  # anything etcd prints before its logger is up
            member.process = subprocess.Popen(
                dying_with_parent(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a terminal's Ctrl-C reaches us; we stop members by PID
            )

    def _terminate(self, index: int) -> None:
        process = self._members[index].process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                os.kill(process.pid, signal.SIGCONT)  # a paused member must see the SIGTERM
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._members[index].process = None

    def _connect(self, port: int, timeout: float) -> http.client.HTTPConnection:
        if self._context is not None:
            return http.client.HTTPSConnection(self.host, port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(self.host, port, timeout=timeout)

    def _post(self, index: int, path: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        conn = self._connect(self._members[index].client_port, timeout=10.0)
        try:
            conn.request("POST", path, json.dumps(body), dict(headers))
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EtcdError(f"etcd member {index}: {path}: {exc}") from None
        finally:
            conn.close()
        if response.status != 200:
            raise EtcdError(f"etcd member {index}: {path}: HTTP {response.status}: {data[:300]!r}")
        reply: dict[str, Any] = json.loads(data)
        return reply

    def _healthy(self, member: _Member) -> bool:
        conn = self._connect(member.client_port, timeout=1.0)
        try:
            conn.request("GET", "/health")
            body = conn.getresponse().read()
            return json.loads(body).get("health") == "true"
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def main(argv: Sequence[str] | None = None) -> int:
    """A throwaway etcd of ``--nodes`` members until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m dbwrap_py.testing.servers.etcd", description="a throwaway etcd on 127.0.0.1 until SIGTERM or Ctrl-C"
    )
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3, 5))
    args = parser.parse_args(argv)

    def banner(cluster: EtcdCluster) -> str:
        pids = ", ".join(str(cluster.pid(i)) for i in range(args.nodes))
        return (f"etcd {args.nodes} member(s), pid(s) {pids}, data in {cluster.root}\n"
                f"  use: -o endpoints={cluster.endpoints}")

    serve_until_stopped(EtcdCluster(nodes=args.nodes), banner)
    return 0


class EtcdHooks(TestHooks):
    """The etcd adapter's test hooks (dbwrap_py.testing.hooks)."""

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """A one-node etcd, when the options name no endpoints
        (``throwaway_host``: where it listens; not an adapter option)."""
        if options.get("endpoints"):
            return None
        return _one_node(str(options.get("throwaway_host", "127.0.0.1")))

    def throwaway_agent_ttl(self, options: Mapping[str, str]) -> float:
        """The processes' lease_ttl."""
        from dbwrap_py.adapters.etcd.client import DEFAULT_LEASE_TTL
        from dbwrap_py.options import Options

        return float(Options(dict(options)).get_int("lease_ttl", DEFAULT_LEASE_TTL, minimum=1))

    def store_counters(self, options: Mapping[str, str]) -> dict[str, int]:
        """Requests etcd has handled, by gRPC method (its /metrics:
        grpc_server_handled_total), summed over every member; {} over TLS."""
        totals: dict[str, int] = {}
        for endpoint in str(options.get("endpoints", "")).split(","):
            if not endpoint or endpoint.startswith("https://"):
                return {}
            url = (endpoint if "://" in endpoint else "http://" + endpoint) + "/metrics"
            with urllib.request.urlopen(url, timeout=10) as reply:
                text = reply.read().decode()
            for line in text.splitlines():
                if line.startswith("grpc_server_handled_total{"):
                    method = line.split('grpc_method="', 1)[1].split('"', 1)[0]
                    totals[method] = totals.get(method, 0) + int(float(line.rsplit(" ", 1)[1]))
        return totals

    def diagnose(self, options: Mapping[str, str], shown: int = 5) -> list[str]:
        """Pending release requests in full; each database's last wipe; record
        locks, bucket claims, detached marks and openers counted per database
        and holder, a few of each shown; and a throwaway cluster's log."""
        lines = _requests_and_holds(options, shown)
        cluster = RUNNING.get(str(options.get("endpoints", "")))
        if cluster is not None:
            lines += ["etcd's log (last lines):", *cluster.log_tail(20).splitlines()]
        return lines


@contextmanager
def _one_node(host: str) -> Iterator[dict[str, str]]:
    with EtcdCluster(nodes=1, host=host) as cluster:
        yield {"endpoints": cluster.endpoints}


def _requests_and_holds(options: Mapping[str, str], shown: int) -> list[str]:
    """What the store holds under the prefix: release requests; each
    database's last CLEAR_IF_FIRST wipe (its revision against etcd's now);
    and record locks, bucket claims, detached marks and openers grouped by
    database and holder."""
    from dbwrap_py.adapters.etcd.client import _b64, _Config, _Session, _unb64
    from dbwrap_py.adapters.etcd.keys import prefix_end, prefix_option
    from dbwrap_py.options import Options

    parsed = Options(dict(options))
    config = _Config.from_options(parsed)
    prefix = prefix_option(parsed) + b"/"
    session = _Session(config)
    try:
        reply = session.transport.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))},
                                       time.monotonic() + config.op_timeout, True)
    finally:
        session.close()
    requests, groups, wipes = [], {}, []
    for kv in reply.get("kvs", []):
        key, value, lease = _unb64(kv["key"]), _unb64(kv.get("value")), int(kv.get("lease", 0))
        if b"/_nodes/" in key and b"/r/" in key:
            requests.append(f"release request {key!r} (requester's lease {lease:x})")
            continue
        db, _, rest = key[len(prefix):].partition(b"/")
        if rest == b"w":  # a CLEAR_IF_FIRST wipe: when the last one was
            wipes.append(f"{db!r} last wiped at revision {kv['mod_revision']} "
                         f"(now {reply['header']['revision']})")
            continue
        kind = next((name for part, name in ((b"/l/", "lock"), (b"/b/", "bucket claim"),
                                             (b"/x/", "detached mark"), (b"/o/", "opener")) if part in key), None)
        if kind is not None:
            holder = key.rpartition(b"/o/")[2] if kind == "opener" else value
            groups.setdefault((db, kind, holder), []).append(f"{key!r} lease {lease:x}")
    lines = (requests or ["(no release requests)"]) + wipes
    for (db, kind, holder), keys in sorted(groups.items(), key=lambda g: -len(g[1])):
        lines.append(f"{len(keys)} {kind}(s) of {db!r} held by {holder!r}")
        lines.extend(f"  {k}" for k in keys[:shown])
    return lines


HOOKS = EtcdHooks()


if __name__ == "__main__":
    raise SystemExit(main())
