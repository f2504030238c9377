"""A throwaway ZooKeeper (one standalone server, or an ensemble of three),
for tests, benchmarks and ``dbwrap-py check zookeeper``. It listens on
127.0.0.1, or on the address ``host`` names (an address of this host: a
networked cluster's nodes in namespaces of their own reach the host only at
its bridge's, so SambaCluster passes the hooks ``throwaway_host``, and
``throwaway_zookeeper(host)`` starts a standalone server there).

    with ZooKeeperServer() as zk:
        zk.hosts          # "127.0.0.1:PORT", the adapter's option hosts
        zk.kill()         # SIGKILL by PID: a dead server

    with ZooKeeperServer(nodes=3) as zk:
        zk.hosts               # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
        victim = zk.leader()   # the index (0-2) whose srvr says "Mode: leader"
        zk.kill_server(victim) # SIGKILL that one by PID
        zk.wait_leader()       # the survivors elect another (index, seconds)
        zk.start_server(victim)  # again, on its old data directory

Debian's ``zookeeper`` package ships ``/usr/share/java/zookeeper.jar``,
whose manifest names the rest of its classpath; ``java -cp`` that jar runs
one server in the foreground: ``ZooKeeperServerMain`` for a standalone one,
``QuorumPeerMain`` for an ensemble member. Each server has a directory of
its own in one temporary directory (its ``zoo.cfg``, its data, with the
``myid`` an ensemble member needs, and its log); the zoo.cfg here: free
ports on that address (a client port, bound to it alone by
clientPortAddress, and for an ensemble a quorum and an election port per
member), no admin server (no other port), ``ruok``, ``srvr`` and ``mntr``
among the four-letter words (``srvr``'s ``Mode:`` line is the readiness
probe and names the leader), and a 250 ms tick so sessions may be as short
as 1 s. Every server dies with the thread that started it
(``dying_with_parent``) and is stopped by its PID.

``python -m dbwrap_py.testing.servers.zookeeper [--nodes 1|3]`` runs one
until SIGTERM (so does ``dbwrap-py zookeeper``).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from dbwrap_py.servers import ServerError, StartStop, dying_with_parent, jvm_jit_flags, serve_until_stopped, stop_process
from dbwrap_py.testing.servers import log_tails
from dbwrap_py.testing.hooks import LeasedHooks

HOST = "127.0.0.1"
#: Debian's path (package zookeeper); the manifest's Class-Path brings the rest
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 250
#: ensemble sizes the class runs: standalone, or three members (a quorum of two)
NODE_COUNTS = (1, 3)
ZOO_CFG = """tickTime={tick}
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir={data}
clientPort={port}
clientPortAddress={host}
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
maxClientCnxns=0
"""
#: an ensemble member's lines beside ZOO_CFG: a follower has initLimit
#: ticks (10 s) to sync with a new leader and loses it after syncLimit (2 s)
#: without an answer; the server.N lines name every member's ports
ENSEMBLE_CFG = """initLimit=40
syncLimit=8
"""


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago (start() retries on a race)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports that were free a moment ago (all bound at
    once, so none is given twice; start() retries on a race)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]


def four_letters(host: str, port: int, word: bytes, timeout: float = 1.0) -> bytes:
    """A four-letter word's answer (the server closes after it), b"" if the
    server does not answer."""
    chunks: list[bytes] = []
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(word)
            while chunk := conn.recv(4096):
                chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


def mode_of(srvr: bytes) -> str:
    """``srvr``'s ``Mode:`` (leader, follower, standalone), "" if none: not
    serving (no quorum, an election under way) or not answering."""
    for line in srvr.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip()
    return ""


class _Peer:
    """One server of the ensemble: its myid (index + 1), ports, directory."""

    def __init__(self, index: int, root: Path, client_port: int, quorum_port: int, election_port: int) -> None:
        self.index, self.myid = index, index + 1
        self.client_port, self.quorum_port, self.election_port = client_port, quorum_port, election_port
        self.dir = root / f"zk{self.myid}"
        self.config = self.dir / "zoo.cfg"
        self.data = self.dir / "data"
        self.log = self.dir / "zookeeper.log"
        self.process: subprocess.Popen[bytes] | None = None


class ZooKeeperServer(StartStop):
    """``nodes`` ZooKeeper servers (1: standalone, 3: an ensemble) on
    ``host`` (every one on ports of its own), in a temporary directory;
    each stopped by its PID."""

    def __init__(self, jar: str = DEBIAN_JAR, start_timeout: float = 60.0, host: str = HOST,
                 nodes: int = 1) -> None:
        if nodes not in NODE_COUNTS:
            raise ValueError(f"nodes: {nodes} is not one of {NODE_COUNTS}")
        self.jar, self.start_timeout, self.host, self.nodes = jar, start_timeout, host, nodes
        self.java = shutil.which("java")
        self.root: Path | None = None
        self.peers: list[_Peer] = []

    # -- what the adapter and tests use -------------------------------------------

    @property
    def hosts(self) -> str:
        """``host:port`` of every server's client port, comma separated."""
        return ",".join(f"{self.host}:{peer.client_port}" for peer in self.peers)

    @property
    def port(self) -> int:
        """The first server's client port."""
        return self.peers[0].client_port if self.peers else 0

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The first server's process."""
        return self.peers[0].process if self.peers else None

    @property
    def log(self) -> Path:
        """The first server's log."""
        if not self.peers:
            raise ServerError("zookeeper is not started")
        return self.peers[0].log

    def pid(self, index: int) -> int | None:
        """Server ``index``'s PID while it runs."""
        process = self.peers[index].process
        return process.pid if process is not None and process.poll() is None else None

    def mode(self, index: int) -> str:
        """Server ``index``'s own word on its role (``srvr``'s Mode):
        leader, follower or standalone; "" while it serves nobody."""
        if self.pid(index) is None:
            return ""
        return mode_of(four_letters(self.host, self.peers[index].client_port, b"srvr"))

    def leader(self) -> int | None:
        """The index of the server that says it leads (a standalone server
        leads itself), None while there is none."""
        for index in range(len(self.peers)):
            if self.mode(index) in ("leader", "standalone"):
                return index
        return None

    def wait_leader(self, timeout: float = 30.0) -> tuple[int, float]:
        """(the leader's index, seconds waited) once a server says it leads
        and a follower follows (in an ensemble); ServerError after ``timeout``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            leader = self.leader()
            if leader is not None and (self.nodes == 1 or "follower" in map(self.mode, range(len(self.peers)))):
                return leader, time.monotonic() - started
            time.sleep(0.02)
        raise ServerError(f"zookeeper: no leader within {timeout:g} s; the logs:\n{self.log_tail()}")

    def kill_server(self, index: int) -> None:
        """SIGKILL server ``index`` by its PID, and wait for it: a crash."""
        process = self.peers[index].process
        if process is not None:
            stop_process(process, signal.SIGKILL)
            self.peers[index].process = None

    def kill(self) -> None:
        """SIGKILL every server by PID: a dead ZooKeeper."""
        for index in range(len(self.peers)):
            self.kill_server(index)

    def start_server(self, index: int) -> None:
        """Start a killed server again on its data directory; return once it
        serves (in an ensemble that needs a quorum)."""
        if self.pid(index) is not None:
            raise ServerError(f"zookeeper server {index} is running")
        self._spawn(self.peers[index])
        if not self._wait_serving([self.peers[index]]):
            raise ServerError(f"zookeeper server {index} exited; its log:\n{self.log_tail()}")

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self.java is None or not Path(self.jar).exists():
            raise ServerError(f"no java or no {self.jar} (Debian: apt-get install zookeeper)")
        self.root = Path(tempfile.mkdtemp(prefix="dbwrap-py-zookeeper-"))
        for attempt in range(3):  # a port taken between free_ports and the bind: try others
            for peer in self.peers:  # the last try's logs stay, for the error
                shutil.rmtree(peer.dir, ignore_errors=True)
            ports = free_ports(self.nodes if self.nodes == 1 else 3 * self.nodes, self.host)
            if self.nodes == 1:
                ports += [0, 0]
            self.peers = [_Peer(i, self.root, *ports[3 * i:3 * i + 3]) for i in range(self.nodes)]
            for peer in self.peers:
                self._configure(peer)
                self._spawn(peer)
            if self._wait_serving(self.peers):
                return
            self._stop_all()
        raise ServerError(f"zookeeper did not start; its log:\n{self.log_tail()}")

    def stop(self) -> None:
        self._stop_all()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _stop_all(self) -> None:
        for peer in self.peers:
            if peer.process is not None:
                stop_process(peer.process, signal.SIGTERM, timeout=10.0)
                peer.process = None

    def _configure(self, peer: _Peer) -> None:
        peer.data.mkdir(parents=True)
        text = ZOO_CFG.format(tick=TICK_MS, data=peer.data, port=peer.client_port, host=self.host)
        if self.nodes > 1:
            (peer.data / "myid").write_text(f"{peer.myid}\n")
            text += ENSEMBLE_CFG + "".join(f"server.{p.myid}={self.host}:{p.quorum_port}:{p.election_port}\n"
                                           for p in self.peers)
        peer.config.write_text(text)

    def _spawn(self, peer: _Peer) -> None:
        assert self.java is not None
        heap = "-Xmx256m" if self.nodes == 1 else "-Xmx160m"
        argv = [self.java, heap, "-XX:+UseSerialGC", *jvm_jit_flags(), "-cp", self.jar,
                MAIN if self.nodes == 1 else QUORUM_MAIN, str(peer.config)]
        with open(peer.log, "ab") as log:
            peer.process = subprocess.Popen(dying_with_parent(argv), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=peer.dir)

    def _wait_serving(self, peers: Sequence[_Peer]) -> bool:
        """True once each of ``peers`` serves (srvr names its Mode), False
        if one exited (a port race, say); ServerError after start_timeout."""
        deadline = time.monotonic() + self.start_timeout
        waiting = list(peers)
        while waiting:
            waiting = [p for p in waiting if not mode_of(four_letters(self.host, p.client_port, b"srvr"))]
            if any(p.process is None or p.process.poll() is not None for p in waiting):
                return False
            if waiting and time.monotonic() > deadline:
                raise ServerError(f"zookeeper not ready within {self.start_timeout:g} s; "
                                  f"its log:\n{self.log_tail()}")
            if waiting:
                time.sleep(0.1)
        return True

    def log_tail(self, lines: int = 20) -> str:
        return log_tails(((f"server {peer.myid}" if self.nodes > 1 else None, peer.log) for peer in self.peers),
                         lines) or "(no log)"


@contextlib.contextmanager
def throwaway_zookeeper(host: str = HOST) -> Iterator[dict[str, str]]:
    """A standalone server for the run on ``host`` (an address of this
    host), as the adapter's options (``hosts``, which name that address)."""
    with ZooKeeperServer(host=host) as server:
        yield {"hosts": server.hosts}


class ZooKeeperHooks(LeasedHooks):
    """The zookeeper adapter's test hooks (dbwrap_py.testing.hooks): a node
    agent's lease is the session timeout (LeasedHooks: lease_for)."""

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """One server, when the options name no hosts (``throwaway_host``:
        where it listens; not an adapter option)."""
        if options.get("hosts"):
            return None
        return throwaway_zookeeper(str(options.get("throwaway_host") or HOST))


HOOKS = ZooKeeperHooks("zookeeper")


def main(argv: Sequence[str] | None = None) -> int:
    """A throwaway ZooKeeper of ``--nodes`` servers until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m dbwrap_py.testing.servers.zookeeper",
                                     description="a throwaway ZooKeeper on 127.0.0.1 until SIGTERM or Ctrl-C")
    parser.add_argument("--nodes", type=int, default=1, choices=NODE_COUNTS,
                        help="3: an ensemble (a quorum of two), for fault tests")
    args = parser.parse_args(argv)

    def banner(zk: ZooKeeperServer) -> str:
        pids = ", ".join(f"{zk.pid(i)} ({zk.mode(i) or 'not serving'})" for i in range(zk.nodes))
        return (f"zookeeper {zk.nodes} server(s), pid(s) {pids}, data in {zk.root}\n"
                f"  use: -o hosts={zk.hosts}")

    serve_until_stopped(ZooKeeperServer(nodes=args.nodes), banner)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
