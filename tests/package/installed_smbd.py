"""make test-deb's checks, in a fresh Debian root where apt installed the
package (tests/package/run.sh) and nothing of the checkout is present.

smbd starts as systemd would start smbd.service with the package's drop-in,
and serves a guest share whose share-mode and SMB2 databases live in a
throwaway etcd, reached through the node daemon started as its unit starts
it. Only the root's own python3 runs this (no venv, no pytest); every
process it starts it stops, by PID (smbd: its own process group).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

UNITS = Path("/lib/systemd/system")
HOST = "127.0.0.201"
ETCD_URL = f"http://{HOST}:23791"
ETCD_PEER = f"http://{HOST}:23801"
SMB_PORT = 4457
SOCKET = Path("/run/dbwrap_py/proxy.sock")
LOGS = Path("/var/log/dbwrap-py-test")
SHARE = Path("/srv/demo")
ROUTED = ("locking.tdb", "brlock.tdb", "leases.tdb", "smbXsrv_open_global.tdb",
          "smbXsrv_session_global.tdb", "smbXsrv_tcon_global.tdb", "smbXsrv_client_global.tdb",
          "smbXsrv_version_global.tdb")
SMB_CONF = f"""[global]
	server role = standalone server
	interfaces = {HOST}/8
	bind interfaces only = yes
	smb ports = {SMB_PORT}
	disable netbios = yes
	map to guest = bad user
	logging = file
	log level = 1
	dbwrap_py:module = etcd
	dbwrap_py:transport = proxy
""" + "".join(f"\tdbwrap_py:{name} = yes\n" for name in ROUTED) + f"""
[demo]
	path = {SHARE}
	read only = no
	guest ok = yes
"""
DAEMON_CONF = f"""[daemon]
directories = /run/samba /var/cache/samba

[database *]
adapter = etcd
endpoints = {ETCD_URL}
"""


class Failure(Exception):
    """A check that did not hold; the message says what was seen."""


class Started:
    """The processes this test started, stopped in reverse order by PID."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], umask: int = 0o022) -> subprocess.Popen[bytes]:
        log = open(LOGS / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.umask(umask))
        log.close()
        self.procs.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for name, proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # its own group: smbd's children too
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                print(f"  {name} (pid {proc.pid}) outlived SIGTERM by 20 s: SIGKILL")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def unit_settings(*paths: Path) -> dict[str, list[str]]:
    """Each key's values across a unit and its drop-ins, in order
    (continuation lines joined, comments dropped)."""
    settings: dict[str, list[str]] = {}
    for path in paths:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;[" or "=" not in line:
                continue
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def environment_of(settings: dict[str, list[str]]) -> dict[str, str]:
    """Environment= and EnvironmentFile= as systemd applies them (the files after)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for value in settings.get("Environment", []):
        env.update(item.split("=", 1) for item in shlex.split(value) if "=" in item)
    for value in settings.get("EnvironmentFile", []):
        path = Path(value.lstrip("-"))
        if path.exists():
            for line in path.read_text().splitlines():
                if "=" in line and not line.lstrip().startswith("#"):
                    key, _, val = line.partition("=")
                    env[key.strip()] = val.strip().strip('"')
        elif not value.startswith("-"):
            raise Failure(f"EnvironmentFile={value}: missing")
    return env


def command_of(settings: dict[str, list[str]], env: dict[str, str]) -> list[str]:
    """ExecStart= with $VAR (split into words) and ${VAR} expanded, as systemd does."""
    (exec_start,) = settings["ExecStart"]
    argv: list[str] = []
    for word in shlex.split(exec_start.lstrip("-@:+!")):
        if word.startswith("$") and not word.startswith("${"):
            argv.extend(env.get(word[1:], "").split())
            continue
        for key, val in env.items():
            word = word.replace("${" + key + "}", val)
        argv.append(word)
    return argv


def verify_units() -> None:
    """The units as systemd reads them (man pages aside: the root has no man)."""
    units = [UNITS / "dbwrap-py-proxy.service", UNITS / "dbwrap-py-node-agent.service", UNITS / "smbd.service"]
    run = subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, units)], capture_output=True, text=True,
                         timeout=120)
    print(run.stdout + run.stderr, end="")
    if run.returncode != 0:
        raise Failure(f"systemd-analyze verify exited {run.returncode}")
    dropin = UNITS / "smbd.service.d" / "dbwrap-py.conf"
    if not dropin.exists():
        raise Failure(f"{dropin}: not installed")


def etcd_call(path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(ETCD_URL + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def etcd_up() -> bool:
    try:
        with urllib.request.urlopen(ETCD_URL + "/health", timeout=2) as reply:
            return json.loads(reply.read()).get("health") == "true"
    except OSError:
        return False


def start_etcd(started: Started) -> None:
    argv = ["etcd", "--name", "pkgtest", "--data-dir", "/var/tmp/pkgtest-etcd",
            "--listen-client-urls", ETCD_URL, "--advertise-client-urls", ETCD_URL,
            "--listen-peer-urls", ETCD_PEER, "--initial-advertise-peer-urls", ETCD_PEER,
            "--initial-cluster", f"pkgtest={ETCD_PEER}"]
    started.start("etcd", argv, {"PATH": "/usr/bin:/bin"})
    wait_for(f"etcd at {ETCD_URL}", etcd_up, 60)


def start_daemon(started: Started) -> None:
    # what systemd-tmpfiles-setup does at boot, before any service
    subprocess.run(["systemd-tmpfiles", "--create", "/usr/lib/tmpfiles.d/dbwrap-py.conf"], check=True,
                   timeout=60)
    conf = Path("/etc/dbwrap_py/daemon.conf")
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(DAEMON_CONF)
    settings = unit_settings(UNITS / "dbwrap-py-proxy.service")
    env = environment_of(settings)
    for name in settings.get("RuntimeDirectory", []):
        Path("/run", name).mkdir(mode=int(settings.get("RuntimeDirectoryMode", ["0755"])[0], 8), exist_ok=True)
    umask = int(settings.get("UMask", ["0022"])[0], 8)
    argv = command_of(settings, env)
    print("  daemon:", shlex.join(argv))
    proc = started.start("proxy-daemon", argv, env, umask)
    wait_for(f"the daemon's socket {SOCKET}", lambda: SOCKET.exists() or proc.poll() is not None, 60)
    if proc.poll() is not None:
        raise Failure(f"the daemon exited {proc.returncode}")


def smb_listening() -> bool:
    try:
        with socket.create_connection((HOST, SMB_PORT), timeout=1):
            return True
    except OSError:
        return False


def start_smbd(started: Started) -> subprocess.Popen[bytes]:
    Path("/etc/samba/smb.conf").write_text(SMB_CONF)
    SHARE.mkdir(parents=True, exist_ok=True)
    SHARE.chmod(0o1777)
    settings = unit_settings(UNITS / "smbd.service", *sorted((UNITS / "smbd.service.d").glob("*.conf")))
    env = environment_of(settings)
    if "LD_PRELOAD" not in env:
        raise Failure("smbd.service with its drop-ins sets no LD_PRELOAD")
    argv = command_of(settings, env)
    print(f"  smbd: LD_PRELOAD={env['LD_PRELOAD']} {shlex.join(argv)}")
    proc = started.start("smbd", argv, env)
    wait_for(f"smbd on {HOST}:{SMB_PORT}", lambda: smb_listening() or proc.poll() is not None, 60)
    if proc.poll() is not None:
        raise Failure(f"smbd exited {proc.returncode}")
    return proc


def copy_through_share() -> None:
    sent = Path("/etc/os-release")
    back = Path("/var/tmp/pkgtest-back")
    run = subprocess.run(["smbclient", f"//{HOST}/demo", "-p", str(SMB_PORT), "-N", "-m", "SMB3",
                          "-c", f"put {sent} hello.txt; get hello.txt {back}"],
                         capture_output=True, text=True, timeout=120)
    print(run.stdout + run.stderr, end="")
    if run.returncode != 0:
        raise Failure(f"smbclient exited {run.returncode}")
    if back.read_bytes() != sent.read_bytes() or (SHARE / "hello.txt").read_bytes() != sent.read_bytes():
        raise Failure("the file read back through the share differs from the one written")


def session_pids(leader: int) -> list[int]:
    """The processes of the session this test started smbd in: smbd and
    its children. (A chroot shares the host's PIDs: /proc also shows the
    host's own smbd processes, which are not ours to look at.)"""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == leader:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def check_maps(smbd: subprocess.Popen[bytes]) -> None:
    env = environment_of(unit_settings(*sorted((UNITS / "smbd.service.d").glob("*.conf"))))
    preload = env["LD_PRELOAD"]
    maps = Path(f"/proc/{smbd.pid}/maps").read_text()
    for wanted in (preload, str(Path(preload).parent / "dbwrap_py" / "libdbwrap_py.so")):
        if wanted not in maps:
            raise Failure(f"smbd (pid {smbd.pid}) has not mapped {wanted}")
    read = 0
    for pid in session_pids(smbd.pid):
        try:
            text = Path(f"/proc/{pid}/maps").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a child that ended since the listing (a client's, after its logoff)
        read += 1
        python = sorted({line.split()[-1] for line in text.splitlines() if "python" in line})
        if python:
            raise Failure(f"smbd (pid {pid}) mapped {', '.join(python)}: proxy mode carries no Python in smbd")
    print(f"  smbd maps {preload} and its bridge; {read} processes of its session, none with Python")


def databases_in_etcd() -> set[str]:
    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()
    reply = etcd_call("/v3/kv/range", {"key": b64(b"dbwrap_py/"), "range_end": b64(b"dbwrap_py0"),
                                       "keys_only": True, "limit": 10000})
    keys = [base64.b64decode(kv["key"]) for kv in reply.get("kvs", [])]  # type: ignore[union-attr]
    return {key.split(b"/")[1].split(b"@")[0].decode() for key in keys if key.count(b"/") >= 2}


def check_store() -> None:
    found = databases_in_etcd()
    print(f"  etcd holds keys of: {', '.join(sorted(found)) or 'nothing'}")
    missing = {"locking.tdb", "smbXsrv_open_global.tdb"} - found
    if missing:
        raise Failure(f"etcd holds no key of {', '.join(sorted(missing))}: smbd did not reach it")


PLANTED = Path("/var/tmp/pkgtest-planted")
PLANTED_RAN = Path("/var/tmp/pkgtest-planted-ran")
PLANTED_CODE = f"open({str(PLANTED_RAN)!r}, 'w').close()\n"


def plant_code() -> dict[str, str]:
    """A package named dbwrap_py in a folder and in a venv that a checkout's
    build would take from $DBWRAP_PY_PATH and $DBWRAP_PY_VENV; importing
    either leaves a mark. The environment that names them."""
    (PLANTED / "path" / "dbwrap_py").mkdir(parents=True, exist_ok=True)
    (PLANTED / "path" / "dbwrap_py" / "__init__.py").write_text(PLANTED_CODE)
    venv = PLANTED / "venv"
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "dbwrap_py").mkdir(parents=True, exist_ok=True)
    (site / "dbwrap_py" / "__init__.py").write_text(PLANTED_CODE)
    (venv / "bin").mkdir(exist_ok=True)
    if not (venv / "bin" / "python3").exists():
        (venv / "bin" / "python3").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    (PLANTED / "cwd" / "dbwrap_py").mkdir(parents=True, exist_ok=True)
    (PLANTED / "cwd" / "dbwrap_py" / "__init__.py").write_text(PLANTED_CODE)
    return {"DBWRAP_PY_PATH": str(PLANTED / "path"), "DBWRAP_PY_VENV": str(venv),
            "PYTHONPATH": str(PLANTED / "path")}


def check_planted_code_ignored() -> None:
    """Samba's dbwrap_tool through the preload, in process (Python in the
    tool itself), with the planted code named by the environment and as
    the working directory: the installed bridge runs the installed package
    (the record lands in sqlite, the adapter smb.conf names) and never the
    planted one."""
    lock = PLANTED / "lock"
    lock.mkdir(parents=True, exist_ok=True)
    conf = PLANTED / "inproc.conf"
    conf.write_text("[global]\n\tdbwrap_py:module = sqlite\n\tdbwrap_py:pkgtest.tdb = yes\n")
    preload = environment_of(unit_settings(*sorted((UNITS / "smbd.service.d").glob("*.conf"))))["LD_PRELOAD"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_PRELOAD": preload, **plant_code()}
    database = str(lock / "pkgtest.tdb")
    for op in (["store", "k", "int32", "7"], ["fetch", "k", "int32"]):
        run = subprocess.run(["dbwrap_tool", "-s", str(conf), "--persistent", database, *op], env=env,
                             cwd=PLANTED / "cwd", capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise Failure(f"dbwrap_tool {' '.join(op)} exited {run.returncode}: {run.stdout}{run.stderr}")
    if run.stdout.strip() != "7":
        raise Failure(f"dbwrap_tool fetch read {run.stdout.strip()!r}, not the 7 it stored")
    if PLANTED_RAN.exists():
        raise Failure("the bridge imported a planted dbwrap_py ($DBWRAP_PY_PATH, $DBWRAP_PY_VENV or the cwd)")
    header = (lock / "pkgtest.tdb.sqlite").read_bytes()[:16]
    if header != b"SQLite format 3\0":
        raise Failure(f"{lock}/pkgtest.tdb.sqlite is not the sqlite adapter's file: the record did not go "
                      "through the bridge")
    print("  the record went through the installed package to sqlite; no planted dbwrap_py ran")


def show_logs() -> None:
    paths = [*sorted(LOGS.glob("*.log")), Path("/var/log/samba/log.smbd")]
    for path in paths:
        if path.exists():
            lines = path.read_text(errors="replace").splitlines()[-25:]
            print(f"--- the last {len(lines)} lines of {path}:")
            print("\n".join(lines))


def main() -> int:
    LOGS.mkdir(parents=True, exist_ok=True)
    started = Started()
    steps: list[tuple[str, Callable[[], object]]] = [
        ("systemd-analyze verify", verify_units),
        ("a throwaway etcd", lambda: start_etcd(started)),
        ("the node daemon, as its unit starts it", lambda: start_daemon(started)),
        ("in process: planted code named by the environment or the cwd is ignored", check_planted_code_ignored),
    ]
    try:
        for name, step in steps:
            print(f"==> {name}")
            step()
        print("==> smbd, as smbd.service with the drop-in starts it")
        smbd = start_smbd(started)
        print("==> a file written and read back through the share")
        copy_through_share()
        print("==> what smbd mapped, and what reached etcd")
        check_maps(smbd)
        check_store()
    except (Failure, OSError, subprocess.SubprocessError) as exc:
        print(f"test-deb: FAILED: {exc}")
        show_logs()
        return 1
    finally:
        started.stop_all()
    print("test-deb: the installed package served the share on etcd through the node daemon")
    return 0


if __name__ == "__main__":
    sys.exit(main())
