"""The proxy daemon as a child process, for tests and throwaway setups."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from dbwrap_py.proxy.log import request_counts
from dbwrap_py.servers import ServerError, dying_with_parent, log_end, stop_process


class ProxyDaemonProcess:
    """``python -m dbwrap_py.proxy.daemon`` in its own session, stopped by PID.

    Its log is ``daemon.log`` in a temporary directory of its own, which also
    holds the socket unless ``socket_path`` names one. ``kill()`` then
    ``start()`` restarts it on the same path.
    """

    def __init__(self, socket_path: str | Path | None = None, group: str | None = None,
                 config: str | Path | None = None, metrics_port: str | None = None,
                 command_prefix: Sequence[str] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dbwrap-py-proxy-"))
        self.socket_path = str(socket_path or self.dir / "proxy.sock")
        self.group = group
        #: the daemon's --config (policy.py); None: root's own daemon, no --group
        self.config = str(config) if config is not None else None
        #: the daemon's --metrics-port ([ADDR:]PORT; "0": any free port); None: no metrics
        self.metrics_port = metrics_port
        #: what the daemon's command runs under (a cluster node's network namespace)
        self.command_prefix = list(command_prefix)
        self.log = self.dir / "daemon.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "ProxyDaemonProcess":
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout: float = 15.0) -> None:
        argv = [sys.executable, "-m", "dbwrap_py.proxy.daemon", "--socket", self.socket_path,
                *(["--group", self.group] if self.group else []),
                *(["--config", self.config] if self.config else []),
                *(["--metrics-port", self.metrics_port] if self.metrics_port is not None else [])]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(dying_with_parent([*self.command_prefix, *argv]),
                                            stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise ServerError(f"proxy daemon did not come up; its log ends: {log_end(self.log)}")
            time.sleep(0.02)

    def _accepts(self) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.socket_path)
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM closes everything and removes the socket; SIGKILL is a crash."""
        if self.process is not None:
            stop_process(self.process, sig)
            self.process = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def metrics_url(self) -> str:
        """Where the running daemon serves its metrics, as it logged it."""
        found = re.findall(r"metrics on (http://\S+/metrics)", self.log_text())
        if not found:
            raise ServerError("the proxy daemon serves no metrics (no --metrics-port)")
        return found[-1]

    def request_counts(self) -> dict[str, int]:
        """The requests it took in, by op name, as it logged them when it
        stopped (SIGTERM; after ``stop()``)."""
        return request_counts(self.log_text())
