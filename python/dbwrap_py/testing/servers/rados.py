"""A throwaway Ceph cluster (one mon, 1 or 3 memstore OSDs) on 127.0.0.1, or
another address of this host (``host``), for tests and benchmarks.

    with CephCluster(osds=3) as ceph:
        ceph.options()                          # {"conf": ".../ceph.conf", "pool": "dbwrap_py"}
        ceph.stop_daemon("osd.1", sig=signal.SIGKILL)   # by PID
        ceph.start_daemon("osd.1")              # same id, same data directory
        ceph.stop_daemon("mon.a"); ceph.start_daemon("mon.a")   # the mon keeps its store

What it runs: Debian's ceph-mon and ceph-osd in the foreground (``-f``), as
children of this process, so their PIDs are ours to signal and every daemon
dies with the process that started it (PR_SET_PDEATHSIG). No mgr (none is
installed, and pool, object, omap, lock and watch I/O need none), auth none
(or cephx, ``auth="cephx"``: see below), msgr v2 only, every socket on
127.0.0.1: the mon on a free port, the OSDs in a port range of their own
(``ms bind port min/max``), so clusters run side by side.

``host`` (``CephCluster(host=...)``, the hooks' ``throwaway_host``, ``--host``)
puts every socket on another IPv4 address of this host instead: the bridge
address SambaCluster passes when its nodes sit in network namespaces, which
reach the host's namespace only there. The conf's ``mon host`` and ``public
addr``/``cluster addr`` name that address, so the mon, the OSDs' listeners
and the addresses they publish in the maps are all on it, and a client given
the conf reaches the mon and then the OSDs there.

Settings chosen for tests:

* memstore OSDs: objects live in the OSD's memory, and reach its directory
  only when it stops by SIGTERM (``osd fast shutdown = false``; Pacific's
  fast default exits without). A SIGKILLed OSD loses what it took since its
  last clean stop: with three OSDs (size 3, min_size 2) start_daemon()
  brings it back and it recovers from the other two; with one, its
  placement groups would have no copy left and block for ever, so
  start_daemon() refuses (CephError) instead.
* ``paxos propose interval = 0.05`` (the default 1 s made each mon change
  take a second: start took ~4.6 s instead of ~1.5 s).
* Down-marking in seconds, not minutes. A SIGKILLed OSD is down in ~0.1 s
  at any setting: its peers' "connection refused" is an immediate report.
  A paused (SIGSTOPped) one is down once it misses heartbeats for the grace,
  4 s here (measured 4.8-8.6 s until the map shows it down), and only
  because one reporter is enough: the default asks for two on different
  hosts, which one host never has (measured: still up after 25 s; the mon
  would wait for mon_osd_report_timeout, 15 minutes), and meanwhile its
  placement groups block every client until its op timeout.
* Down OSDs are never marked out: with 3 OSDs and 3 replicas there is
  nowhere to move their data, so "out" would only churn the maps.
* Recovery without the 0.1 s sleep per object Ceph takes on a disk (a
  memstore OSD counts as one): a restarted OSD catches up in about a second.
* ``mon mgr mkfs grace`` of a year, so the missing mgr is not a health error.
* Clients (the [client] section, so the adapter's clients too): no admin
  socket (many processes would fight over one); ops fail with TimedOut
  after ``client_op_timeout`` seconds instead of blocking forever; and a
  client asks the mon for a new OSD map once an op has waited 1 s
  (``objecter timeout``, default 10 s). A restarted OSD binds the same ports
  its dead predecessor had, so a client that slept through the restart
  sends to it with an outdated map and gets nowhere until it asks: with
  the default, an op timeout under 10 s never lets it ask (measured: a
  client with a 2 s op timeout kept timing out for 60 s).

With ``auth="cephx"`` every daemon and client must authenticate. The
mon's keyring (``mon.`` and ``client.admin``) is made with ceph-authtool
before the mon's mkfs; each OSD makes its own key at mkfs (``--mkkey``),
which the admin then registers (``auth add``). The admin's keyring is a
file of its own that the conf does not name: options() gives a client the
conf and pool only, options("admin") or options(<a user from add_user()>)
adds that user's name and keyring.

Objects written while the mon is down still go through (a client needs the
mon only for a new map, a mon command or connecting).

``main(argv)`` runs one cluster in the foreground until SIGTERM or SIGINT
(``python -m dbwrap_py.testing.servers.rados --osds 3``, or
``dbwrap-py ceph --osds 3``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

from dbwrap_py.servers import ServerError, dying_with_parent, pause_process, serve_until_stopped, stop_process
from dbwrap_py.testing.servers import log_tails
from dbwrap_py.testing.hooks import LeasedHooks

HOST = "127.0.0.1"
POOL = "dbwrap_py"
PG_NUM = 8
#: ports in the window per OSD: it binds four (public, cluster, two
#: heartbeat), the lowest free ones; the spare ones are for a port some
#: other program takes after the window was picked
PORTS_PER_OSD = 8
MEMSTORE_BYTES = 1 << 30
#: seconds each ceph tool we run (monmaptool, mkfs) may take
TOOL_TIMEOUT = 30.0
#: the probe's op timeout: short, so wait_healthy retries soon after a
#: stalled op, long enough for placement groups to peer after a restart
PROBE_TIMEOUT = 2
PROBE_NAMESPACE = "dbwrap_py_probe"  # out of the way of the adapter's objects

#: log lines a tail leaves out: the mon logs every command it is sent, and
#: wait_healthy sends one every 50 ms
_NOISE = ("handle_command mon_command", "log_channel(audit)")

#: the throwaway clusters running in this process, by conf path (for
#: diagnostics: a failed run can show their logs)
RUNNING: dict[str, "CephCluster"] = {}

AUTH_MODES = ("none", "cephx")


class CephError(ServerError):
    """The throwaway Ceph could not be started, or did not become healthy."""


def _port_window(size: int, host: str = HOST) -> list[int]:
    """``size`` consecutive ports that can be bound on ``host`` now, below the
    kernel's ephemeral range (where outgoing connections would take them meanwhile)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        base = random.randrange(10000, low - size)
        ports = list(range(base, base + size))
        if all(_bindable(p, host) for p in ports):
            return ports
    raise CephError(f"no {size} consecutive free ports on {host} below {low}")


def _bindable(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ceph binds
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise CephError(f"no {name} on PATH (Debian: apt-get install {package})")
    return path


def _import_rados() -> Any:
    try:
        import rados
    except ImportError:
        raise CephError("no rados Python module (Debian: apt-get install python3-rados,"
                        " and a venv with system site packages)") from None
    return rados


def _class_dir() -> str:
    """Where the OSDs' object classes are (cls_lock: the adapter's record
    locks). Named in the conf, since Debian 13's Ceph 18 looks for them in a
    relative path by default ("could not stat class lib/.../libcls_lock.so")."""
    for candidate in sorted(Path("/usr/lib").glob("*/rados-classes")) + [Path("/usr/lib/rados-classes")]:
        if (candidate / "libcls_lock.so").exists():
            return str(candidate)
    raise CephError("no libcls_lock.so in /usr/lib/*/rados-classes (Debian: apt-get install ceph-osd)")


def _auth_text(auth: str) -> str:
    """The [global] auth settings; with cephx every daemon and client must authenticate."""
    if auth == "none":
        return """\
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
"""
    return """\
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
"""


#: with cephx, each daemon reads its own key from its data directory, and the
#: conf names no keyring a client could find the admin's key in
_CEPHX_KEYRINGS = """\
[mon]
keyring = $mon_data/keyring
[osd]
keyring = $osd_data/keyring
"""


def _conf_text(root: Path, fsid: str, mon_port: int, osd_ports: Sequence[int], osds: int,
               client_op_timeout: int, auth: str = "none", host: str = HOST) -> str:
    size = min(osds, 3)
    min_size = max(1, size - 1)  # a replicated pool keeps writing with one replica down
    return f"""\
[global]
fsid = {fsid}
mon host = [v2:{host}:{mon_port}]
mon initial members = a
# the OSDs bind, and publish in the OSD map, these addresses
public addr = {host}
cluster addr = {host}
ms bind ipv6 = false
# msgr v2 only: no legacy v1 listeners
ms bind msgr1 = false
ms bind port min = {osd_ports[0]}
ms bind port max = {osd_ports[-1]}
{_auth_text(auth)}auth allow insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
run dir = {root}/run
admin socket = {root}/run/$name.asok
pid file = {root}/run/$name.pid
log file = {root}/log/$name.log
# the mon's cluster log goes to /var/log/ceph otherwise
mon cluster log file = {root}/log/cluster.log
# not every mon command (audit DBG lines), so a log tail shows what happened
# (the first name is Ceph 16's, the second Ceph 18's; each ignores the other)
mon cluster log file level = info
mon cluster log level = info
crash dir = {root}/crash
keyring = {root}/keyring
mon data = {root}/mon/$cluster-$id
osd data = {root}/osd/$cluster-$id
osd objectstore = memstore
osd class dir = {_class_dir()}
memstore device bytes = {MEMSTORE_BYTES}
# SIGTERM unmounts the store, which is when memstore writes its objects to
# disk (the fast default exits without, and a restart finds them gone)
osd fast shutdown = false
osd pool default size = {size}
osd pool default min size = {min_size}
osd pool default pg num = {PG_NUM}
osd pool default pgp num = {PG_NUM}
osd pool default pg autoscale mode = off
# all OSDs are on one host: replicas go to distinct OSDs, not hosts
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# no mgr is installed; it is not needed for I/O
mon mgr mkfs grace = 31536000
paxos propose interval = 0.05
# every client and daemon finds a restarted mon in about a second, not 3 s and more
mon client hunt interval = 0.5
# a dead OSD is down within seconds (see the module's docstring)
osd heartbeat interval = 1
osd heartbeat grace = 4
mon osd adjust heartbeat grace = false
mon osd min down reporters = 1
mon osd reporter subtree level = osd
mon osd down out interval = 0
mon warn on osd down out interval zero = false
# a test machine's disk may be fuller than a mon likes; it is not a health problem here
mon data avail warn = 1
# memstore counts as a disk: recovery would sleep 0.1 s between objects
osd recovery sleep hdd = 0
osd recovery sleep ssd = 0
osd recovery sleep hybrid = 0
[client]
admin socket =
log file = {root}/log/client.log
rados osd op timeout = {client_op_timeout}
rados mon op timeout = {client_op_timeout}
# ask for a new OSD map after 1 s, not 10 s (see the module's docstring)
objecter timeout = 1
objecter tick interval = 1
""" + (_CEPHX_KEYRINGS if auth == "cephx" else "")


class _Daemon:
    """One ceph-mon or ceph-osd: its id, files and (while it runs) process."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name  # "mon.a", "osd.0"
        self.kind, self.ident = name.split(".", 1)
        self.log = root / "log" / f"{name}.log"
        self.out = root / "log" / f"{name}.out"  # what it prints before its log is open
        self.data = root / self.kind / f"ceph-{self.ident}"
        self.process: subprocess.Popen[bytes] | None = None
        #: whether it last stopped by SIGTERM (a memstore OSD then saved its objects)
        self.clean_stop = False

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class CephCluster:
    """One mon (``mon.a``) and ``osds`` memstore OSDs on ``host`` (an IPv4
    address of this host; 127.0.0.1 by default), in a temporary directory,
    with pool ``pool`` created (size min(osds, 3))."""

    def __init__(self, osds: int = 1, *, pool: str = POOL, start_timeout: float = 60.0,
                 client_op_timeout: int = 30, auth: str = "none", host: str = HOST) -> None:
        if osds < 1:
            raise ValueError("a Ceph cluster needs at least one OSD")
        if auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, not {auth!r}")
        self.osds = osds
        self.auth = auth
        self.host = host
        self.pool = pool
        self.start_timeout = start_timeout
        self.client_op_timeout = client_op_timeout
        self.root: Path | None = None
        self.mon_port = 0
        self._daemons: dict[str, _Daemon] = {}
        self._admin: Any = None  # rados.Rados: mon commands and probes
        #: with cephx: each client user's keyring file, by name ("admin" included)
        self._keyrings: dict[str, Path] = {}

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> "CephCluster":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Create the cluster and its pool; return once a write and a read on the pool succeed."""
        binaries = [("ceph-mon", "ceph-mon"), ("ceph-osd", "ceph-osd"), ("monmaptool", "ceph-base")]
        if self.auth == "cephx":
            binaries.append(("ceph-authtool", "ceph-common"))
        for binary, package in binaries:
            _binary(binary, package)
        _import_rados()
        for attempt in range(3):  # the mon's port taken between the check and its bind: new ports
            try:
                self._create()
                RUNNING[self.conf_path] = self
                return
            except CephError as exc:
                logs = self.log_tail()
                self.stop()
                if "Address already in use" not in logs or attempt == 2:
                    raise CephError(f"{exc}\n{logs}") from None
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Kill every daemon by PID, then remove the temporary directory.

        SIGKILL, not SIGTERM: a memstore OSD's clean stop writes all its
        objects to disk, only for them to be removed the moment after.
        """
        if self.root is not None:
            RUNNING.pop(self.conf_path, None)
        self._close_admin()
        for daemon in self._daemons.values():
            self._kill(daemon, signal.SIGKILL)
        self._daemons = {}
        self._keyrings = {}
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # -- what tests use -----------------------------------------------------

    @property
    def conf_path(self) -> str:
        if self.root is None:
            raise CephError("the cluster is not running")
        return str(self.root / "ceph.conf")

    @property
    def mon_host(self) -> str:
        return f"[v2:{self.host}:{self.mon_port}]"

    def options(self, user: str | None = None) -> dict[str, str]:
        """The rados adapter's options that reach this cluster; with ``user``
        (cephx: "admin" or a name add_user() made) its name and keyring too."""
        options = {"conf": self.conf_path, "pool": self.pool}
        if user is not None:
            options.update(user=user, keyring=str(self._keyring_of(user)))
        return options

    @property
    def admin_keyring(self) -> str:
        """The keyring file with client.admin's key (cephx only)."""
        return str(self._keyring_of("admin"))

    def add_user(self, name: str, caps: dict[str, str] | None = None) -> str:
        """Create ``client.<name>`` with ``caps`` (by default: read the maps,
        read and write this cluster's pool); the path of a keyring file that
        holds its key and nothing else."""
        if self.auth != "cephx":
            raise CephError("users need auth=\"cephx\"; this cluster runs without auth")
        if caps is None:
            caps = {"mon": "allow r", "osd": f"allow rwx pool={self.pool}"}
        flat = [word for service, cap in caps.items() for word in (service, cap)]
        text = self.mon_command({"prefix": "auth get-or-create", "entity": f"client.{name}",
                                 "caps": flat})
        assert self.root is not None
        path = self.root / f"client.{name}.keyring"
        self._write_secret(path, text)
        self._keyrings[name] = path
        return str(path)

    def _keyring_of(self, user: str) -> Path:
        try:
            return self._keyrings[user]
        except KeyError:
            raise CephError(f"no keyring for client.{user} (auth {self.auth}; users:"
                            f" {', '.join(self._keyrings) or 'none'})") from None

    @staticmethod
    def _write_secret(path: Path, text: str) -> None:
        """A key file only its owner reads (ceph-authtool makes its files so too)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)

    @property
    def daemons(self) -> list[str]:
        return list(self._daemons)

    def pid_of(self, name: str) -> int | None:
        daemon = self._daemon(name)
        return daemon.process.pid if daemon.process is not None and daemon.running() else None

    def stop_daemon(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stop one daemon by PID with ``sig`` (SIGKILL: a crash) and reap it.

        SIGTERM is a clean stop: a memstore OSD then saves its objects and
        start_daemon() brings them back; after SIGKILL it has lost them.
        """
        self._kill(self._daemon(name), sig, timeout)

    def pause_daemon(self, name: str) -> None:
        """SIGSTOP: the daemon keeps its sockets but answers nothing."""
        pid = self.pid_of(name)
        if pid is not None:
            pause_process(pid)

    def resume_daemon(self, name: str) -> None:
        pid = self.pid_of(name)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def start_daemon(self, name: str, wait: bool = True, timeout: float | None = None) -> None:
        """Start a stopped daemon again on its data directory; with ``wait``,
        return once it is up (an OSD: up in the OSD map) and the pool takes a
        write and a read.

        The daemon dies with the thread that calls this (PR_SET_PDEATHSIG
        follows the thread that forked): call it from a thread that outlives
        the daemon, as the main thread does.
        """
        daemon = self._daemon(name)
        if daemon.running():
            raise CephError(f"{name} is running")
        if daemon.kind == "osd" and self.osds == 1 and not daemon.clean_stop:
            # its placement groups would wait forever for a copy nobody has
            raise CephError(f"{name} lost its memstore objects (it did not stop by SIGTERM), and"
                            " with one OSD no replica holds them: stop it with SIGTERM, or use osds=3")
        self._spawn(daemon)
        if wait:
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running OSD is up in the OSD map and a probe
        object on the pool can be written and read back.

        CephError, with every daemon's log tail, if a daemon we started has
        exited or the time runs out.
        """
        try:
            self._wait_healthy(self.start_timeout if timeout is None else timeout)
        except CephError as exc:
            raise CephError(f"{exc}\n{self.log_tail()}") from None

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no attempt"
        while True:
            self._check_alive()
            try:
                down = self._osds_not_up()
                if not down:
                    self._probe()
                    return
                last = f"{', '.join(down)} not up in the OSD map"
            except CephError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise CephError(f"ceph not healthy in {timeout:.0f} s: {last}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` of each daemon's log and output, and of the cluster log."""
        if self.root is None:
            return ""
        files = [f for d in self._daemons.values() for f in (d.out, d.log)] + [self.root / "log" / "cluster.log"]
        return log_tails(((path.name, path) for path in files), lines,
                         noise=lambda line: any(n in line for n in _NOISE))

    def rss_kib(self) -> dict[str, int]:
        """Each running daemon's resident set size (KiB), for benchmarks' notes."""
        sizes = {}
        for name, daemon in self._daemons.items():
            if daemon.process is None or not daemon.running():
                continue
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{daemon.process.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        sizes[name] = int(line.split()[1])
        return sizes

    def mon_command(self, command: dict[str, Any], inbuf: bytes = b"") -> str:
        """One mon command (as the ``ceph`` CLI sends it, ``inbuf`` as its
        ``-i`` file); its output, or CephError."""
        rados = _import_rados()
        try:
            ret, out, status = self._admin_handle().mon_command(json.dumps(command), inbuf)
        except rados.Error as exc:
            raise CephError(f"ceph {command['prefix']}: {exc}") from None
        if ret != 0:
            raise CephError(f"ceph {command['prefix']}: {os.strerror(-ret)}: {status}")
        return out.decode(errors="replace")

    # -- creating it ----------------------------------------------------------

    def _create(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dbwrap-py-ceph-"))
        for sub in ("mon", "osd", "run", "log", "crash"):
            (self.root / sub).mkdir()
        ports = _port_window(1 + PORTS_PER_OSD * self.osds, self.host)
        self.mon_port = ports[0]
        fsid = str(uuid.uuid4())
        conf = _conf_text(self.root, fsid, self.mon_port, ports[1:], self.osds, self.client_op_timeout,
                          self.auth, self.host)
        Path(self.conf_path).write_text(conf)
        deadline = time.monotonic() + self.start_timeout
        self._make_mon(fsid)
        for _ in range(self.osds):
            self._make_osd()
        self.mon_command({"prefix": "osd pool create", "pool": self.pool,
                          "pg_num": PG_NUM, "pgp_num": PG_NUM})
        # without an application the cluster warns POOL_APP_NOT_ENABLED
        self.mon_command({"prefix": "osd pool application enable", "pool": self.pool,
                          "app": "dbwrap_py", "yes_i_really_mean_it": True})
        self._wait_healthy(max(1.0, deadline - time.monotonic()))  # start() adds the logs

    def _make_mon(self, fsid: str) -> None:
        assert self.root is not None
        monmap = self.root / "monmap"
        self._tool("monmaptool", "--create", "--clobber", "--fsid", fsid,
                   "--addv", "a", self.mon_host, str(monmap))
        mon = self._daemons["mon.a"] = _Daemon("mon.a", self.root)
        keyring = ["--keyring", self._make_mon_keyring()] if self.auth == "cephx" else []
        self._tool("ceph-mon", "-c", self.conf_path, "--mkfs", "-i", "a", "--monmap", str(monmap),
                   *keyring)
        self._spawn(mon)

    def _make_mon_keyring(self) -> str:
        """The keyring the mon's mkfs starts its auth database from: its own
        key, and client.admin's, which also gets a file of its own (the
        admin handle's) that has nothing else in it."""
        assert self.root is not None
        admin = self.root / "client.admin.keyring"
        mon = self.root / "mon.keyring"
        self._tool("ceph-authtool", "--create-keyring", str(admin), "--gen-key", "-n", "client.admin",
                   "--cap", "mon", "allow *", "--cap", "osd", "allow *")
        self._tool("ceph-authtool", "--create-keyring", str(mon), "--gen-key", "-n", "mon.",
                   "--cap", "mon", "allow *")
        self._tool("ceph-authtool", str(mon), "--import-keyring", str(admin))
        self._keyrings["admin"] = admin
        return str(mon)

    def _make_osd(self) -> None:
        assert self.root is not None
        osd_uuid = str(uuid.uuid4())
        ident = self.mon_command({"prefix": "osd new", "uuid": osd_uuid}).strip()
        osd = self._daemons[f"osd.{ident}"] = _Daemon(f"osd.{ident}", self.root)
        osd.data.mkdir(parents=True)
        # with cephx it makes its key ($osd_data/keyring) and, having none
        # the mon knows yet, must not ask the mon for its config first
        mkkey = ["--mkkey", "--no-mon-config"] if self.auth == "cephx" else []
        self._tool("ceph-osd", "-c", self.conf_path, "-i", ident, "--mkfs", "--osd-uuid", osd_uuid, *mkkey)
        if self.auth == "cephx":
            # the mon must know the key before the OSD can log in with it
            self.mon_command({"prefix": "auth add", "entity": f"osd.{ident}",
                              "caps": ["osd", "allow *", "mon", "allow profile osd"]},
                             (osd.data / "keyring").read_bytes())
        self._spawn(osd)

    def _tool(self, *argv: str) -> None:
        """Run one ceph tool to completion; CephError with its output if it fails."""
        try:
            result = subprocess.run(dying_with_parent(argv), stdin=subprocess.DEVNULL, capture_output=True,
                                    timeout=TOOL_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise CephError(f"{argv[0]} did not finish in {TOOL_TIMEOUT:.0f} s") from None
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace").strip()
            raise CephError(f"{' '.join(argv)}: exit {result.returncode}\n{output}")

    # -- daemons --------------------------------------------------------------

    def _daemon(self, name: str) -> _Daemon:
        try:
            return self._daemons[name]
        except KeyError:
            raise CephError(f"no daemon {name!r} (have: {', '.join(self._daemons)})") from None

    def _spawn(self, daemon: _Daemon) -> None:
        binary = _binary(f"ceph-{daemon.kind}", f"ceph-{daemon.kind}")
        daemon.clean_stop = False
        with open(daemon.out, "ab") as out:
            daemon.process = subprocess.Popen(
                dying_with_parent([binary, "-f", "-c", self.conf_path, "-i", daemon.ident]),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # a terminal's Ctrl-C reaches us; we stop daemons by PID
            )

    def _kill(self, daemon: _Daemon, sig: int, timeout: float = 30.0) -> None:
        process = daemon.process
        if process is None:
            return
        stop_process(process, sig, timeout)
        daemon.clean_stop = sig == signal.SIGTERM and process.returncode == 0
        daemon.process = None

    def _check_alive(self) -> None:
        """CephError if a daemon we started (and did not stop) has exited (callers add the logs)."""
        for daemon in self._daemons.values():
            if daemon.process is not None and daemon.process.poll() is not None:
                raise CephError(f"{daemon.name} exited with status {daemon.process.returncode}")

    # -- the admin client -------------------------------------------------------

    def _admin_handle(self) -> Any:
        """A librados client with short timeouts, kept for mon commands and probes."""
        if self._admin is None:
            rados = _import_rados()
            conf = {
                "rados_osd_op_timeout": str(PROBE_TIMEOUT),
                "rados_mon_op_timeout": "5",
                "client_mount_timeout": "5",
            }
            if self.auth == "cephx":
                conf["keyring"] = self.admin_keyring  # the conf names none (see _CEPHX_KEYRINGS)
            handle = rados.Rados(conffile=self.conf_path, conf=conf)
            try:
                handle.connect()
            except rados.Error as exc:
                with contextlib.suppress(rados.Error):
                    handle.shutdown()
                self._check_alive()  # a mon that exited says why, not just "timed out"
                raise CephError(f"cannot reach the mon at {self.mon_host}: {exc}") from None
            self._admin = handle
        return self._admin

    def _close_admin(self) -> None:
        if self._admin is not None:
            # before the daemons go: a client without a mon waits out its timeouts
            with contextlib.suppress(Exception):
                self._admin.shutdown()
            self._admin = None

    def _osds_not_up(self) -> list[str]:
        """The running OSDs the OSD map does not show up yet."""
        dump = json.loads(self.mon_command({"prefix": "osd dump", "format": "json"}))
        up = {f"osd.{o['osd']}" for o in dump.get("osds", []) if o.get("up")}
        return [n for n, d in self._daemons.items() if d.kind == "osd" and d.running() and n not in up]

    def _probe(self) -> None:
        rados = _import_rados()
        payload = uuid.uuid4().bytes
        try:
            with self._admin_handle().open_ioctx(self.pool) as ioctx:
                ioctx.set_namespace(PROBE_NAMESPACE)
                ioctx.write_full("probe", payload)
                if ioctx.read("probe") != payload:
                    raise CephError("the probe object read back wrong")
                ioctx.remove_object("probe")
        except rados.Error as exc:
            # the next attempt on a new client: one that slept through an
            # OSD's restart may hold a map that still sends to the dead one
            self._close_admin()
            raise CephError(f"probe on pool {self.pool}: {type(exc).__name__}: {exc}") from None


@contextlib.contextmanager
def throwaway_cluster(osds: int = 1, host: str = HOST) -> Iterator[dict[str, str]]:
    """A cluster on ``host`` for as long as the block runs; yields the rados adapter's options."""
    with CephCluster(osds=osds, host=host) as cluster:
        yield cluster.options()


def main(argv: Sequence[str] | None = None) -> int:
    """A throwaway Ceph with ``--osds`` OSDs until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m dbwrap_py.testing.servers.rados",
        description="a throwaway Ceph (one mon, memstore OSDs) on 127.0.0.1 (or --host) until SIGTERM or Ctrl-C")
    parser.add_argument("--osds", type=int, default=1, choices=(1, 3))
    parser.add_argument("--auth", default="none", choices=AUTH_MODES)
    parser.add_argument("--host", default=HOST, help="the IPv4 address of this host it listens on")
    args = parser.parse_args(argv)

    def banner(cluster: CephCluster) -> str:
        pids = ", ".join(f"{name} {cluster.pid_of(name)}" for name in cluster.daemons)
        # whoever runs it from a shell is its admin: with cephx, hand over the admin's key
        admin = "admin" if cluster.auth == "cephx" else None
        options = " ".join(f"-o {k}={v}" for k, v in cluster.options(admin).items())
        keyring = f" -k {cluster.admin_keyring}" if admin else ""
        return (f"ceph: {pids}; mon at {cluster.mon_host}, data in {cluster.root}\n"
                f"  use: {options}\n"
                f"  the ceph CLI: ceph -c {cluster.conf_path}{keyring} osd dump")

    serve_until_stopped(CephCluster(osds=args.osds, auth=args.auth, host=args.host), banner)
    return 0


class RadosHooks(LeasedHooks):
    """The rados adapter's test hooks (dbwrap_py.testing.hooks)."""

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """A one-OSD memstore cluster, when the options name none
        (``throwaway_host``: where it listens; not an adapter option)."""
        if options.get("conf") or options.get("mon_host"):
            return None
        return throwaway_cluster(host=str(options.get("throwaway_host", HOST)))

    def store_counters(self, options: Mapping[str, str]) -> dict[str, int]:
        """Ops the OSDs have served (their perf counters), summed over the OSDs:
        op_r reads, op_w writes, op_rw read-modify-writes (a cls call that writes)."""
        from dbwrap_py.adapters.rados import client as rc

        client = rc.ClientConfig.from_options(options, 10.0).connect()
        totals = {"osd_op_r": 0, "osd_op_w": 0, "osd_op_rw": 0}
        try:
            _, out, _ = client.mon_command(json.dumps({"prefix": "osd ls", "format": "json"}), b"")
            for osd in json.loads(out):
                _, out, _ = client.osd_command(osd, json.dumps({"prefix": "perf dump"}), b"")
                perf = json.loads(out)["osd"]
                for name in totals:
                    totals[name] += int(perf[name[4:]])
        finally:
            client.shutdown()
        return totals


HOOKS = RadosHooks("rados")


if __name__ == "__main__":
    raise SystemExit(main())
