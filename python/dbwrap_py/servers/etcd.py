"""A throwaway etcd cluster (1 or 3 members) on 127.0.0.1, for tests and benchmarks.

    with EtcdCluster(nodes=3) as etcd:
        etcd.endpoints            # "127.0.0.1:p0,127.0.0.1:p1,127.0.0.1:p2"
        etcd.stop_member(0)       # SIGKILL by PID
        etcd.start_member(0)      # same data dir, --initial-cluster-state existing

Settings chosen for tests: 10 ms heartbeats and 100 ms elections (a fresh
member is healthy in ~0.1 s, and the minimum lease TTL drops from 2 s to 1 s),
auto-compaction by revision (a long benchmark does not grow without bound),
and a large --max-txn-ops, so dbwrap transactions of many records fit in one
etcd transaction. Logs go to files next to the data directories, and every
member dies with the process that started it (PR_SET_PDEATHSIG), so an
interrupted test run leaves no server behind.

``main(argv)`` runs one cluster in the foreground until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from dbwrap_py.servers import ServerError

HOST = "127.0.0.1"
#: how many revisions auto-compaction keeps (a paged scan pins one revision)
COMPACTION_RETENTION = 10000
MAX_TXN_OPS = 4096

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: members just outlive a crashed parent
    _prctl = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago (the caller retries on a race)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class EtcdError(ServerError):
    """The throwaway etcd could not be started."""


class _Member:
    def __init__(self, index: int, root: Path, client_port: int, peer_port: int) -> None:
        self.name = f"m{index}"
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = root / f"{self.name}.etcd"
        self.log = root / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"


class EtcdCluster:
    """``nodes`` etcd members on free ports of 127.0.0.1, in a temporary directory."""

    def __init__(
        self,
        nodes: int = 1,
        *,
        heartbeat_ms: int = 10,
        election_ms: int = 100,
        etcd_binary: str | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        if nodes < 1:
            raise ValueError("an etcd cluster needs at least one member")
        binary = etcd_binary or shutil.which("etcd")
        if binary is None:
            raise EtcdError("no etcd binary on PATH (Debian: apt-get install etcd-server)")
        self.nodes = nodes
        self.binary = binary
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.start_timeout = start_timeout
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
            ports = _free_ports(2 * self.nodes)
            self._members = [
                _Member(i, self.root, ports[2 * i], ports[2 * i + 1]) for i in range(self.nodes)
            ]
            try:
                for i in range(self.nodes):
                    self._spawn(i, state="new")
                self.wait_healthy()
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
        for i in range(len(self._members)):
            self._terminate(i)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- what tests use -----------------------------------------------------

    @property
    def endpoints(self) -> str:
        """``host:port`` of every member's client URL, comma separated."""
        return ",".join(f"{HOST}:{m.client_port}" for m in self._members)

    def member_endpoint(self, index: int) -> str:
        return f"{HOST}:{self._members[index].client_port}"

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
            os.kill(pid, signal.SIGSTOP)

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
        out = []
        for member in self._members:
            try:
                text = member.log.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            out.append(f"--- {member.name} ({member.log}) ---")
            out.extend(text)
        return "\n".join(out)

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
        ]
        with open(member.log, "ab") as log:  # anything etcd prints before its logger is up
            member.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a terminal's Ctrl-C reaches us; we stop members by PID
                preexec_fn=_die_with_parent,
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

    @staticmethod
    def _healthy(member: _Member) -> bool:
        conn = http.client.HTTPConnection(HOST, member.client_port, timeout=1.0)
        try:
            conn.request("GET", "/health")
            body = conn.getresponse().read()
            return json.loads(body).get("health") == "true"
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``dbwrap-py etcd [--nodes N]``: a throwaway etcd until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="dbwrap-py etcd", description="a throwaway etcd on 127.0.0.1 until SIGTERM or Ctrl-C"
    )
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3, 5))
    args = parser.parse_args(argv)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        with EtcdCluster(nodes=args.nodes) as cluster:
            pids = ", ".join(str(cluster.pid(i)) for i in range(args.nodes))
            print(
                f"etcd {args.nodes} member(s), pid(s) {pids}, data in {cluster.root}\n"
                f"  endpoints={cluster.endpoints}\n"
                f"  use: -o endpoints={cluster.endpoints}\n"
                f"SIGTERM or Ctrl-C stops it and removes the data",
                flush=True,
            )
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
