"""The installed smbd in proxy mode: every database it opens through the
bridge goes to a throwaway node daemon, and no smbd process maps libpython.

Each test starts its own daemon and Samba, and stops both by PID.
"""

from __future__ import annotations

import grp
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from dbwrap_py.proxy.daemon import ProxyDaemonProcess
from dbwrap_py.samba import PERSISTENT_DATABASES, VOLATILE_DATABASES, SambaSetup, ThrowawaySamba
from dbwrap_py.servers import backend_options


def processes_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                continue
    return pids


def maps_python(pid: int) -> bool:
    try:
        return "libpython" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_smbd_serves_a_client_through_the_daemon_without_python():
    # native_records: an option the daemon must still have when a forked child opens again
    with backend_options("tdb", {"transport": "proxy", "proxy_timeout": "20",
                                 "native_records": "no"}) as options:
        setup = SambaSetup(bridged=VOLATILE_DATABASES + PERSISTENT_DATABASES, log_level=3,
                           adapter_options=options)
        with ThrowawaySamba(setup) as samba:
            # a client that stays connected: its smbd child is among the checked
            client = subprocess.Popen(
                ["smbclient", samba.unc, "-U", samba.credentials, "-p", str(samba.port)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=samba.env, text=True)
            try:
                client.stdin.write("put /etc/hostname via-proxy\nls\n")
                client.stdin.flush()
                deadline = time.monotonic() + 30
                pids = processes_in_group(samba.pid)
                while len(pids) < 2 and time.monotonic() < deadline:
                    time.sleep(0.2)
                    pids = processes_in_group(samba.pid)
                with_python = [pid for pid in pids if maps_python(pid)]
                output, _ = client.communicate("quit\n", timeout=60)
            finally:
                if client.poll() is None:
                    client.kill()
                    client.wait()
            assert client.returncode == 0 and "via-proxy" in output, output
            assert len(pids) >= 2, f"smbd's processes: {pids}"
            assert not with_python, f"smbd processes mapping libpython: {with_python}"
            log = samba.log.read_text(errors="replace")
    opened = set(re.findall(r"dbwrap_py: db=\S*/([^/\s]+) op=open: adapter tdb, proxy transport", log))
    assert set(VOLATILE_DATABASES) | set(PERSISTENT_DATABASES) <= opened, sorted(opened)
    assert "inproc transport" not in log


def smbclient(samba: ThrowawaySamba, command: str) -> subprocess.CompletedProcess:
    return samba.run_tool(["smbclient", samba.unc, "-U", samba.credentials, "-p", str(samba.port),
                           "-c", command], check=False, timeout=120)


def test_a_killed_daemon_gives_clean_errors_and_a_restarted_one_serves_again():
    with ProxyDaemonProcess() as daemon:
        options = {"transport": "proxy", "proxy_socket": daemon.socket_path, "proxy_timeout": "10"}
        setup = SambaSetup(bridged=VOLATILE_DATABASES, log_level=3, adapter_options=options)
        with ThrowawaySamba(setup) as samba:
            before = smbclient(samba, "put /etc/hostname before; ls")
            assert before.returncode == 0 and "before" in before.stdout, before.stdout + before.stderr
            daemon.kill()
            started = time.monotonic()
            during = smbclient(samba, "put /etc/hostname during")
            took = time.monotonic() - started
            assert during.returncode != 0, during.stdout
            assert "NT_STATUS_" in during.stdout + during.stderr
            assert took < 60, f"the failed session took {took:.1f} s"
            assert samba.running(), "smbd died with the daemon"
            log = samba.log.read_text(errors="replace")
            assert re.search(r"dbwrap_py: db=\S+ op=\w+: proxy daemon at \S+: (connect|send|reply): ", log), \
                log[-3000:]
            daemon.start()
            after = smbclient(samba, "put /etc/hostname after; ls")
            assert after.returncode == 0 and "after" in after.stdout, after.stdout + after.stderr


def test_smbd_serves_through_a_daemon_with_a_config_and_a_group(tmp_path):
    """The shape --group requires (issue 39): the daemon's --config names the
    directories and the adapter; smbd sends what it always sends."""
    config = tmp_path / "daemon.conf"
    config.write_text(f"[daemon]\ndirectories = {os.path.realpath(tempfile.gettempdir())}\n\n"
                      "[database *]\nadapter = tdb\nnative_records = no\n")
    config.chmod(0o600)
    with ProxyDaemonProcess(group=grp.getgrgid(os.getgid()).gr_name, config=config) as daemon:
        options = {"transport": "proxy", "proxy_socket": daemon.socket_path, "proxy_timeout": "20",
                   "native_records": "no"}
        setup = SambaSetup(bridged=VOLATILE_DATABASES + PERSISTENT_DATABASES, log_level=3,
                           adapter_options=options)
        with ThrowawaySamba(setup) as samba:
            done = smbclient(samba, "put /etc/hostname via-config; ls")
            assert done.returncode == 0 and "via-config" in done.stdout, done.stdout + done.stderr
            log = samba.log.read_text(errors="replace")
        assert "refused" not in daemon.log_text(), daemon.log_text()[-3000:]
    opened = set(re.findall(r"dbwrap_py: db=\S*/([^/\s]+) op=open: adapter tdb, proxy transport", log))
    assert set(VOLATILE_DATABASES) | set(PERSISTENT_DATABASES) <= opened, sorted(opened)
