"""Start the model of FoundationDB's server for a test run, stop it by PID.

Without a host it listens on a unix socket in a temporary directory; with
one (a networked cluster's bridge address, ``throwaway_host``) on TCP at a
free port of that address, so that nodes in network namespaces of their
own reach it through their network profile's delay relay, as they would a
real cluster (a unix socket, on the shared file system, would skip the
delay). Either way it yields the cluster file naming it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from dbwrap_py.servers import ServerError, dying_with_parent, stop_process
from dbwrap_py.testing.fdb_model import _wire
from dbwrap_py.testing.fdb_model.tests_only import test_run_environment

#: the cluster file's description part: says what answers, wherever the file is read
DESCRIPTION = "dbwrap_py_fdb_model"


@contextlib.contextmanager
def model_server(too_old_seconds: float = 5.0, startup_timeout: float = 20.0,
                 host: str | None = None) -> Iterator[Path]:
    """A model server in a temporary directory; yields its cluster file:
    ``dbwrap_py_fdb_model@unix:<socket>``, or with ``host`` (an IPv4
    address of this host) ``dbwrap_py_fdb_model@tcp:<host>:<port>``."""
    with tempfile.TemporaryDirectory(prefix="fdb-model-") as tmp:
        folder = Path(tmp)
        os.chmod(folder, 0o755)  # smbd's children read the cluster file as the connected user
        log = open(folder / "server.log", "wb")
        process = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "dbwrap_py.testing.fdb_model.server",
                               *_where(folder, host), "--too-old-seconds", str(too_old_seconds)]),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=test_run_environment())
        try:
            address = _wait_for(folder, host, process, startup_timeout)
            cluster_file = folder / "fdb.cluster"
            cluster_file.write_text(_wire.cluster_text(DESCRIPTION, address))
            yield cluster_file
        finally:
            stop_process(process, signal.SIGTERM, timeout=10)
            log.close()


def _where(folder: Path, host: str | None) -> list[str]:
    """The server's arguments saying where it listens."""
    if host is None:
        return ["--socket", str(folder / "model.sock")]
    return ["--tcp", host, "--port-file", str(folder / "port")]


def _address(folder: Path, host: str | None) -> _wire.Address | None:
    """Where the server listens, None while a TCP server has not said its port."""
    if host is None:
        return str(folder / "model.sock")
    with contextlib.suppress(FileNotFoundError):
        return host, int((folder / "port").read_text())  # written whole (os.replace)
    return None


def _wait_for(folder: Path, host: str | None, process: subprocess.Popen, timeout: float) -> _wire.Address:
    """The server's address once it answers a connection; ServerError if it
    exits or does not answer within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"the FoundationDB model's server exited {process.returncode}: "
                              f"{(folder / 'server.log').read_text(errors='replace').strip()}")
        address = _address(folder, host)
        if address is not None:
            with contextlib.suppress(OSError):
                _wire.connect(address).close()
                return address
        time.sleep(0.02)
    where = host if host is not None else folder / "model.sock"
    raise ServerError(f"the FoundationDB model's server did not listen on {where} within {timeout:g} s")
