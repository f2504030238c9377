"""Run a command beside a throwaway node daemon: its socket is in the
command's environment as DBWRAP_PY_PROXY_SOCKET.

    python -m dbwrap_py.proxy.around [--] COMMAND [ARG ...]

The daemon is stopped by PID when the command ends; when the command fails,
the daemon's log follows its output, so a failure explains itself. The exit
status is the command's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from dbwrap_py.proxy.daemon import ProxyDaemonProcess

SOCKET_VARIABLE = "DBWRAP_PY_PROXY_SOCKET"


def main(argv: Sequence[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    with ProxyDaemonProcess() as daemon:
        env = {**os.environ, SOCKET_VARIABLE: str(daemon.socket_path)}
        status = subprocess.run(command, env=env).returncode
        if status != 0:
            sys.stdout.flush()
            log = daemon.log.read_text(errors="replace") if daemon.log.exists() else ""
            print(f"node daemon log ({daemon.log}):\n{log or '(empty)'}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
