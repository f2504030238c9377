"""A throwaway Samba: Debian's smbd on 127.0.0.1, all state under one folder.

Used by the tests, the benchmarks and the demo. It writes an smb.conf with
private, lock, state and cache directories under a temporary folder, adds a
test user, serves one share, and puts the chosen databases behind the bridge
by LD_PRELOADing build/libdbwrap_py_preload.so. smbd runs in its own process
group, and stop() ends that group by smbd's PID, then removes the folder.

    with ThrowawaySamba(SambaSetup(bridged=VOLATILE_DATABASES)) as samba:
        samba.run_tool(["smbclient", samba.unc, "-c", "ls"])
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.paths import bridge_environment, preload_library
from dbwrap_py.servers import StartStop, stop_process_group

TEST_USER = "dbwrappy"
TEST_PASSWORD = "dbwrappy-Pass1"
SHARE = "test"
#: the name smbd-notifyd registers in the lock directory's names.tdb
NOTIFYD_NAME = "notify-daemon"

#: the databases smbd's parent opens for SMB2 state (reference §2.1)
VOLATILE_DATABASES = (
    "locking.tdb",
    "brlock.tdb",
    "leases.tdb",
    "smbXsrv_open_global.tdb",
    "smbXsrv_session_global.tdb",
    "smbXsrv_tcon_global.tdb",
    "smbXsrv_client_global.tdb",
    "smbXsrv_version_global.tdb",
)
PERSISTENT_DATABASES = ("secrets.tdb", "passdb.tdb", "registry.tdb", "share_info.tdb",
                        "group_mapping.tdb", "account_policy.tdb")


class SambaError(RuntimeError):
    """smbd would not start, or a Samba tool failed."""


@dataclass
class SambaSetup:
    """What the throwaway Samba runs with."""

    #: database file names behind the bridge; empty means all native tdb
    bridged: Sequence[str] = ()
    adapter: str = "tdb"
    #: dbwrap_py:<key> = value lines (adapter options, or <db>:<option>)
    adapter_options: Mapping[str, str] = field(default_factory=dict)
    #: more [global] parameters
    extra_global: Mapping[str, str] = field(default_factory=dict)
    log_level: int = 1
    #: the share's VFS modules (Debian: samba-vfs-modules), what smbtorture's suites expect
    share_vfs_objects: str = "acl_xattr streams_xattr"
    #: more share parameters (e.g. continuous availability, Samba 4.25)
    extra_share: Mapping[str, str] = field(default_factory=dict)
    #: more shares on the same folder: name -> their own parameters
    extra_shares: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    port: int | None = None
    #: seconds to wait for smbd to listen
    start_timeout: float = 30.0
    #: add the test user at start; off when the passdb must already have it
    add_user: bool = True
    #: where smbd listens (a cluster's nodes: 127.0.0.1, .2, .3)
    address: str = "127.0.0.1"
    #: the share's folder when others share it (a cluster's nodes); else one in the instance's
    share_path: Path | None = None
    #: the preload library; None: build/'s, LD_PRELOADed only when something is bridged
    preload: Path | None = None
    #: what smbd is started through (a cluster node's ``ip netns exec <ns>``,
    #: which execs smbd: its PID stays smbd's); the Samba tools run without it
    command_prefix: Sequence[str] = ()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_test_user() -> None:
    """The unix account behind the SMB test user (created once, no home)."""
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
            check=True,
        )


class ThrowawaySamba(StartStop):
    """``root``: a folder of an earlier, stopped instance (kept with ``keep``)
    to start again on the same databases, e.g. with another adapter."""

    def __init__(self, setup: SambaSetup, keep: bool = False, root: Path | None = None) -> None:
        self.setup = setup
        self.keep = keep
        self.port = setup.port or free_port()
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="dbwrap_py_samba."))
        self.conf = self.root / "smb.conf"
        self.log = self.root / "log.smbd"
        self.share_path = Path(setup.share_path) if setup.share_path else self.root / SHARE
        self._smbd: subprocess.Popen | None = None
        self._smbd_stderr = None

    # -- addresses ---------------------------------------------------------

    @property
    def unc(self) -> str:
        return f"//{self.setup.address}/{SHARE}"

    @property
    def pid(self) -> int | None:
        """smbd's PID (and process group) while it runs."""
        return self._smbd.pid if self._smbd is not None else None

    def running(self) -> bool:
        return self._smbd is not None and self._smbd.poll() is None

    @property
    def credentials(self) -> str:
        return f"{TEST_USER}%{TEST_PASSWORD}"

    @property
    def env(self) -> dict[str, str]:
        """The environment for smbd and every Samba tool on this instance."""
        env = bridge_environment()
        if self.setup.preload is not None:
            env["LD_PRELOAD"] = str(self.setup.preload)
        elif self.setup.bridged:
            env["LD_PRELOAD"] = str(preload_library())
        return env

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(exist_ok=True)
        os.chmod(self.root, 0o755)  # the test user must reach the share inside
        for sub in ("private", "lock", "state", "cache", "run", "ncalrpc", "binddns"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        self.share_path.mkdir(mode=0o777, exist_ok=True)
        os.chmod(self.share_path, 0o777)
        self.conf.write_text(self.smb_conf())
        ensure_test_user()
        if self.setup.add_user:
            self.run_tool(["smbpasswd", "-c", str(self.conf), "-s", "-a", TEST_USER],
                          input=f"{TEST_PASSWORD}\n{TEST_PASSWORD}\n")
        self._smbd_stderr = open(self.root / "smbd.stderr", "wb")
        self._smbd = subprocess.Popen(
            [*self.setup.command_prefix, "smbd", "--foreground", "--no-process-group",
             f"--configfile={self.conf}"],
            env=self.env,
            stdin=subprocess.DEVNULL,  # smbd --foreground exits when a stdin pipe closes
            stdout=subprocess.DEVNULL,
            stderr=self._smbd_stderr,
            start_new_session=True,  # its own process group, ended by its PID
        )
        self._wait_listening()

    def stop(self) -> None:
        """End smbd and everything it forked, by smbd's PID; remove the folder."""
        if self._smbd is not None:
            stop_process_group(self._smbd)
            self._smbd = None
        if self._smbd_stderr is not None:
            self._smbd_stderr.close()
            self._smbd_stderr = None
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def kill(self) -> None:
        """A crash: SIGKILL to smbd and everything it forked. The folder
        stays until stop()."""
        if self._smbd is not None:
            stop_process_group(self._smbd, signal.SIGKILL)

    def _wait_listening(self) -> None:
        """Until smbd listens and its notify daemon has registered.

        smbd forks smbd-notifyd and listens at once; notifyd registers its
        name a little later. A tree connect in between fails with
        NT_STATUS_NO_MEMORY (notify_init: "No notify daemon around"), which
        CI met once, under load: a client must not come before both."""
        deadline = time.monotonic() + self.setup.start_timeout
        listening = False
        while time.monotonic() < deadline:
            if self._smbd.poll() is not None:
                raise SambaError(f"smbd exited with {self._smbd.returncode}:\n{self.log_tail()}")
            if not listening:
                try:
                    with socket.create_connection((self.setup.address, self.port), timeout=0.5):
                        listening = True
                except OSError:
                    pass
            if listening and self._notifyd_registered():
                return
            time.sleep(0.05)
        waited_for = "its notify daemon to register" if listening else f"it to listen on port {self.port}"
        raise SambaError(f"smbd started, but {self.setup.start_timeout:g} s passed waiting for "
                         f"{waited_for}:\n{self.log_tail()}")

    def _notifyd_registered(self) -> bool:
        """Is smbd-notifyd's name in the messaging names database?"""
        names = self.root / "lock" / "names.tdb"
        if not names.exists():
            return False
        dump = subprocess.run(["tdbdump", str(names)], capture_output=True, text=True, errors="replace",
                              timeout=10, check=False)
        return dump.returncode == 0 and NOTIFYD_NAME in dump.stdout

    # -- helpers -----------------------------------------------------------

    def run_tool(self, argv: Sequence[str], input: str | None = None,
                 timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Samba tool with this instance's environment (and bridge)."""
        result = subprocess.run(list(argv), input=input, env=self.env, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise SambaError(f"{' '.join(argv)} failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
        return result

    def log_position(self) -> int:
        """Where smbd's log ends now; log_since() reads what comes after."""
        return self.log.stat().st_size if self.log.exists() else 0

    def log_since(self, position: int) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(position)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        text = ""
        for path in (self.log, self.root / "smbd.stderr"):
            if path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def smb_conf(self) -> str:
        r = self.root
        params = {
            "netbios name": "DBWRAPPY",
            "workgroup": "DBWRAPPY",
            "server role": "standalone server",
            # lo has only 127.0.0.1 configured: another 127/8 address needs its netmask
            "interfaces": a if (a := self.setup.address) == "127.0.0.1" else f"{a}/8",
            "bind interfaces only": "yes",
            "smb ports": str(self.port),
            "disable netbios": "yes",
            "private dir": f"{r}/private",
            "lock directory": f"{r}/lock",
            "state directory": f"{r}/state",
            "cache directory": f"{r}/cache",
            "pid directory": f"{r}/run",
            "ncalrpc dir": f"{r}/ncalrpc",
            "binddns dir": f"{r}/binddns",
            "log file": str(self.log),
            "max log size": "0",
            "log level": str(self.setup.log_level),
            "passdb backend": "tdbsam",
            "load printers": "no",
            "printing": "bsd",
            "printcap name": "/dev/null",
            "disable spoolss": "yes",
            "server min protocol": "SMB2_02",
            # what smbtorture's smb2 suites expect of a test server
            "kernel oplocks": "no",
            "kernel share modes": "no",
            "posix locking": "no",
            "kernel change notify": "no",
            "ea support": "yes",
            "store dos attributes": "yes",
            "smbd:backgroundqueue": "no",
        }
        params.update(self.setup.extra_global)
        if self.setup.bridged:
            params["dbwrap_py:module"] = self.setup.adapter
            for name in self.setup.bridged:
                params[f"dbwrap_py:{name}"] = "yes"
            for key, value in self.setup.adapter_options.items():
                params[f"dbwrap_py:{key}"] = value
        lines = ["[global]"] + [f"\t{k} = {v}" for k, v in params.items()]
        lines += ["", f"[{SHARE}]", f"\tpath = {self.share_path}", "\tread only = no",
                  f"\tvfs objects = {self.setup.share_vfs_objects}"]
        lines += [f"\t{k} = {v}" for k, v in self.setup.extra_share.items()] + [""]
        for name, share in self.setup.extra_shares.items():
            lines += [f"[{name}]", f"\tpath = {self.share_path}", "\tread only = no",
                      f"\tvfs objects = {self.setup.share_vfs_objects}"]
            lines += [f"\t{k} = {v}" for k, v in share.items()] + [""]
        return "\n".join(lines)
