"""Start the model of FoundationDB's server for a test run, stop it by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from dbwrap_py.servers import ServerError, dying_with_parent, stop_process
from dbwrap_py.testing.fdb_model.tests_only import test_run_environment

#: the cluster file's description part: says what answers, wherever the file is read
DESCRIPTION = "dbwrap_py_fdb_model"


@contextlib.contextmanager
def model_server(too_old_seconds: float = 5.0, startup_timeout: float = 20.0) -> Iterator[Path]:
    """A model server in a temporary directory; yields its cluster file
    (``dbwrap_py_fdb_model@unix:<socket>``)."""
    with tempfile.TemporaryDirectory(prefix="fdb-model-") as tmp:
        os.chmod(tmp, 0o755)  # smbd's children read the cluster file as the connected user
        sock = os.path.join(tmp, "model.sock")
        cluster_file = Path(tmp) / "fdb.cluster"
        cluster_file.write_text(f"{DESCRIPTION}@unix:{sock}\n")
        log = open(os.path.join(tmp, "server.log"), "wb")
        process = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "dbwrap_py.testing.fdb_model.server",
                               "--socket", sock, "--too-old-seconds", str(too_old_seconds)]),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=test_run_environment())
        try:
            _wait_for(sock, process, startup_timeout, Path(tmp) / "server.log")
            yield cluster_file
        finally:
            stop_process(process, signal.SIGTERM, timeout=10)
            log.close()


def _wait_for(path: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"the FoundationDB model's server exited {process.returncode}: "
                              f"{log.read_text(errors='replace').strip()}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            return
        time.sleep(0.02)
    raise ServerError(f"the FoundationDB model's server did not listen on {path} within {timeout:g} s")
