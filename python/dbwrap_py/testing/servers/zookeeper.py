"""A throwaway ZooKeeper (one standalone server) on 127.0.0.1, for tests
and ``dbwrap-py check zookeeper``.

    with ZooKeeperServer() as zk:
        zk.hosts          # "127.0.0.1:PORT", the adapter's option hosts
        zk.kill()         # SIGKILL by PID: a dead server

Debian's ``zookeeper`` package ships ``/usr/share/java/zookeeper.jar``,
whose manifest names the rest of its classpath; ``java -cp`` that jar with
``ZooKeeperServerMain`` and a ``zoo.cfg`` runs one server in the
foreground. The zoo.cfg here: data in a temporary directory, a free port
on 127.0.0.1, no admin server, ``ruok`` (the readiness probe) among the
four-letter words, and a 250 ms tick so sessions may be as short as 1 s.
The server dies with the thread that started it (``dying_with_parent``).

``python -m dbwrap_py.testing.servers.zookeeper`` runs one until SIGTERM.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from dbwrap_py.servers import ServerError, StartStop, dying_with_parent, serve_until_stopped, stop_process
from dbwrap_py.testing.hooks import LeasedHooks

HOST = "127.0.0.1"
#: Debian's path (package zookeeper); the manifest's Class-Path brings the rest
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
TICK_MS = 250
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


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago (start() retries on a race)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def four_letters(host: str, port: int, word: bytes, timeout: float = 1.0) -> bytes:
    """A four-letter word's answer, b"" if the server does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(word)
            return conn.recv(4096)
    except OSError:
        return b""


class ZooKeeperServer(StartStop):
    """One ZooKeeper server in a temporary directory; stopped by PID."""

    def __init__(self, jar: str = DEBIAN_JAR, start_timeout: float = 60.0, host: str = HOST) -> None:
        self.jar, self.start_timeout, self.host = jar, start_timeout, host
        self.java = shutil.which("java")
        self.root: Path | None = None
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        assert self.root is not None
        return self.root / "zookeeper.log"

    def start(self) -> None:
        if self.java is None or not Path(self.jar).exists():
            raise ServerError(f"no java or no {self.jar} (Debian: apt-get install zookeeper)")
        self.root = Path(tempfile.mkdtemp(prefix="dbwrap-py-zookeeper-"))
        for _ in range(3):  # a port taken between free_port and the bind: try another
            self.port = free_port(self.host)
            if self._spawn():
                return
        raise ServerError(f"zookeeper did not start; its log:\n{self.log_tail()}")

    def _spawn(self) -> bool:
        """Start the server; True once it answers ruok, False if it exited."""
        assert self.root is not None and self.java is not None
        config = self.root / "zoo.cfg"
        config.write_text(ZOO_CFG.format(tick=TICK_MS, data=self.root / "data", port=self.port, host=self.host))
        argv = [self.java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", self.jar, MAIN,
                str(config)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(dying_with_parent(argv), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if four_letters(self.host, self.port, b"ruok") == b"imok":
                return True
            if self.process.poll() is not None:
                return False
            time.sleep(0.1)
        raise ServerError(f"zookeeper not ready within {self.start_timeout:g} s; its log:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL by PID, and wait for it: a dead server."""
        if self.process is not None:
            stop_process(self.process, signal.SIGKILL)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, signal.SIGTERM, timeout=10.0)
            self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AssertionError):
            return "(no log)"


@contextlib.contextmanager
def throwaway_zookeeper() -> Iterator[dict[str, str]]:
    """A server for the run, as the adapter's options (``hosts``)."""
    with ZooKeeperServer() as server:
        yield {"hosts": server.hosts}


class ZooKeeperHooks(LeasedHooks):
    """The zookeeper adapter's test hooks (dbwrap_py.testing.hooks): a node
    agent's lease is the session timeout (LeasedHooks: lease_for)."""

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """One server, when the options name no hosts."""
        return None if options.get("hosts") else throwaway_zookeeper()


HOOKS = ZooKeeperHooks("zookeeper")


def main() -> None:
    serve_until_stopped(ZooKeeperServer(), lambda zk: f"zookeeper: -o hosts={zk.hosts} (data in {zk.root})")


if __name__ == "__main__":
    main()
