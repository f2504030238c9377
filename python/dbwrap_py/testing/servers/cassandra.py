"""A throwaway Apache Cassandra cluster (1 or 3 nodes) on the loopback, or
one node on another address of this host, for tests and benchmarks.

    with CassandraCluster(nodes=3) as cassandra:
        cassandra.options()       # {"contact_points": "127.0.0.1:p,127.0.0.2:p,127.0.0.3:p",
                                  #  "replication_factor": "3"}
        cassandra.stop_node(1)    # SIGKILL by PID (pause_node: SIGSTOP)
        cassandra.wait_down(1)    # until the others hold it down
        cassandra.start_node(1)   # same data directory

What it runs: Cassandra 5.0.8's CassandraDaemon straight from its jars, on
the JDK (17; on Debian 13, 21) on PATH, as children of this process, so their PIDs are ours
to signal and every node dies with the process that started it
(PR_SET_PDEATHSIG). The jars come from Maven Central once, by Maven, into
``$XDG_CACHE_HOME/dbwrap_py/cassandra-5.0.8/lib`` (default ``~/.cache``):
100 jars, 67 MiB, 6 s here and up to 2 minutes on a slow link; afterwards
nothing is downloaded.

Node i (0-based) listens on 127.0.0.(i+1). A one-node cluster given
``host``, an address of this host, listens there instead
(``CassandraCluster(host=...)``, ``throwaway_cluster(host=...)``, the
hooks' ``throwaway_host``: SambaCluster's nodes in namespaces of their own
reach the host only at its bridge's address): that is its listen, rpc
(native transport) and seed address, the rpc_address the driver reads in
system.local and connects to, and the contact points the options name.
Every node listens on the same two ports (Cassandra wants one storage port
for the whole cluster), picked free on all the addresses below the
ephemeral range, so a restarted node gets its ports back and clusters run
side by side with a system Cassandra. The first node is the seed; the others join one after another, each with one
token (the ring split evenly) and without bootstrap streaming (a fresh
cluster has nothing to stream).

Settings chosen for tests:

* No fsync (``cassandra.skip_sync``: a killed node keeps what it
  acknowledged, the kernel has it, but a machine crash would lose it), no
  snapshots, short gossip and ring waits, and no memtable overhead
  estimate: a fresh node takes 3-4 s to its native port instead of ~8 s.
* Heap: ``-Xms256M -Xmx1G`` for one node, ``-Xms128M -Xmx512M`` each for
  three. RSS per node: 330-470 MiB once started, 520-590 MiB after a few
  thousand LWTs (run without CAP_IPC_LOCK; see _without_memory_lock).
* The JIT: C1 only under ``DBWRAP_PY_SERVER_JIT=quick``, as the Makefile's
  test targets run it (half the start's CPU); benchmarks keep the full JIT
  (dbwrap_py.servers.jvm_jit_flags).
* ``paxos_variant`` v2 (here the default; Cassandra 5.0's own is v1) or v1,
  for measuring lightweight transactions both ways.
* ``phi_convict_threshold`` 5, the lowest Cassandra takes: the others hold
  a SIGKILLed node down ~10-15 s after the kill (wait_down), not ~20 s.
* With ``auth="password"``: PasswordAuthenticator, and the default
  superuser cassandra/cassandra, created with no delay
  (``cassandra.superuser_setup_delay_ms=0``); on three nodes system_auth
  is replicated to all of them, so a login works with one node down.
* No JMX (no nodetool): the cluster is checked through CQL. More than one
  node is ready when every running node, as coordinator, agrees on the
  schema and reads a ``system_distributed`` partition (a replica on every
  node) at a consistency level of all the running nodes: each then knows
  and sees every other one.

``main(argv)`` runs one cluster in the foreground until SIGTERM or SIGINT
(``python -m dbwrap_py.testing.servers.cassandra --nodes 3``, or
``dbwrap-py cassandra --nodes 3``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

from dbwrap_py.servers import (ServerError, dying_with_parent, jvm_jit_flags, pause_process, serve_until_stopped,
                               stop_process)
from dbwrap_py.testing.servers import log_tails
from dbwrap_py.testing.hooks import LeasedHooks

VERSION = "5.0.8"
#: node i listens on HOSTS[i]: the loopback is all of 127/8 on Linux
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
PAXOS_VARIANTS = ("v1", "v2")
AUTH_MODES = ("none", "password")
#: the default superuser PasswordAuthenticator creates
SUPERUSER = ("cassandra", "cassandra")
#: the password of the PKCS12 keystore a TLS node is given its certificate in (a throwaway's)
KEYSTORE_PASSWORD = "throwaway"


@dataclasses.dataclass(frozen=True)
class CassandraTls:
    """Client TLS for a throwaway cluster: PEM files, such as
    ``dbwrap_py.servers.tls.make_pki`` makes. ``cert`` must name the nodes'
    addresses in IP SANs (127.0.0.1 for one node, or the cluster's
    ``host`` when given): the adapter checks the host name. ``ca`` is what
    the options hand the adapter (tls_ca)."""

    ca: Path
    cert: Path
    key: Path
#: seconds Maven may take for the first download (6 s here with an empty
#: ~/.m2; 74-106 s measured on a slower link)
DOWNLOAD_TIMEOUT = 900.0
#: -Xms/-Xmx per node, by cluster size: three 1 GB heaps crowd a small machine
HEAPS = {1: ("256M", "1G"), 3: ("128M", "512M")}
#: Murmur3Partitioner's tokens are the signed 64-bit integers
_TOKEN_SPAN = 1 << 64

#: the throwaway clusters running in this process, by contact points (for
#: diagnostics: a failed run can show their logs)
RUNNING: dict[str, "CassandraCluster"] = {}


class CassandraError(ServerError):
    """The throwaway Cassandra could not be started, or did not become ready."""


# -- the jars -------------------------------------------------------------------

_POM = f"""\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dbwrap_py</groupId>
  <artifactId>throwaway-cassandra</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>{VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""


def cache_dir() -> Path:
    """Where the jars are kept: the project's cache directory, as scripts/fresh names it."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dbwrap_py" / f"cassandra-{VERSION}"


#: Debian's JDK package for Cassandra 5.0 (Debian 13 has no 17; 21 runs it).
_JDK_PACKAGE = "openjdk-17-jre-headless (Debian 13: openjdk-21-jre-headless)"


#: the JDKs Cassandra 5.0 runs on, preferred in this order. /usr/bin/java is
#: whichever JDK the system prefers, and another package can make that a
#: newer one (Debian sid's zookeeper brings default-jre, JDK 25, on which
#: Cassandra's JVM options stop the VM: "Enabling a Security Manager is not
#: supported").
_SUPPORTED_JDKS = ("17", "21", "11")


def _java() -> str:
    """A java Cassandra 5.0 runs on: Debian's JDK 17, 21 or 11, else PATH's."""
    for version in _SUPPORTED_JDKS:
        for home in sorted(Path("/usr/lib/jvm").glob(f"java-{version}-openjdk-*")):
            if (home / "bin" / "java").exists():
                return str(home / "bin" / "java")
    return _binary("java", _JDK_PACKAGE)


def _binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise CassandraError(f"no {name} on PATH (Debian: apt-get install {package})")
    return path


def jars(timeout: float = DOWNLOAD_TIMEOUT) -> Path:
    """The directory of Cassandra's jars, downloaded by Maven the first time.

    Maven copies them into a temporary directory next to ``lib``, which is
    renamed into place only once Maven succeeded, so an interrupted download
    is never taken for a complete one; a lock file keeps a second process
    from downloading at the same time (it waits, then finds ``lib``).
    """
    cache = cache_dir()
    lib = cache / "lib"
    if lib.is_dir():
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_dir():  # another process downloaded them while we waited
            return lib
        mvn = _binary("mvn", "maven")
        for stale in cache.glob("download-*"):  # a killed download's: nobody else holds the lock
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix="download-", dir=cache))
        try:
            (work / "pom.xml").write_text(_POM)
            output = work / "mvn.log"
            argv = [mvn, "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                    f"-DoutputDirectory={work / 'lib'}"]
            with open(output, "wb") as out:
                try:
                    result = subprocess.run(dying_with_parent(argv), stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise CassandraError(f"Maven did not fetch Cassandra {VERSION} in {timeout:.0f} s:\n"
                                         f"{_tail(output)}") from None
            if result.returncode != 0 or not any((work / "lib").glob("cassandra-all-*.jar")):
                raise CassandraError(f"Maven could not fetch Cassandra {VERSION} (exit {result.returncode}):\n"
                                     f"{' '.join(argv)}\n{_tail(output)}")
            os.rename(work / "lib", lib)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return lib


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path}: {exc.strerror})"


# -- configuration ----------------------------------------------------------------

#: Cassandra's own conf/jvm17-server.options, JPMS section: without them the
#: JDK 17 refuses its reflective access (DirectBuffer.cleaner at the first file)
_JVM_MODULE_FLAGS = """\
-Djdk.attach.allowAttachSelf=true
--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED
--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED
--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED
--add-exports=java.sql/java.sql=ALL-UNNAMED
--add-exports=java.base/java.lang.ref=ALL-UNNAMED
--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED
--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED
--add-opens=java.base/java.lang.module=ALL-UNNAMED
--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED
--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED
--add-opens=java.base/jdk.internal.math=ALL-UNNAMED
--add-opens=java.base/jdk.internal.module=ALL-UNNAMED
--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED
--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED
--add-opens=java.base/sun.nio.ch=ALL-UNNAMED
--add-opens=java.base/java.io=ALL-UNNAMED
--add-opens=java.base/java.lang.reflect=ALL-UNNAMED
--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
--add-opens=java.base/java.lang=ALL-UNNAMED
--add-opens=java.base/java.util=ALL-UNNAMED
-Dio.netty.tryReflectionSetAccessible=true
-Dio.netty.allocator.useCacheForAllThreads=true
-Dio.netty.allocator.maxOrder=11
"""

#: for test speed: no memtable overhead estimate (1-2.5 s), no fsync (a
#: killed node still keeps what it acknowledged: the kernel has it), no
#: waits for gossip to settle, a 1 s ring delay (30 s by default) and the
#: default superuser at once; foreground keeps stdout open after startup.
#: Cassandra installs a SecurityManager (for user functions), which JDK 18
#: and later refuse unless allowed: Debian 13 has JDK 21 and no 17.
#: Not cassandra.unsafesystem, which saved 0.5 s of start: it leaves schema
#: changes unflushed, and a node SIGKILLed and started again had lost them
#: (its keyspaces gone, even one made a minute before the kill).
_JVM_TEST_FLAGS = """\
-Dcassandra-foreground=yes
-Dcassandra.memtable.row_overhead_size=180
-Dcassandra.skip_wait_for_gossip_to_settle=0
-Dcassandra.ring_delay_ms=1000
-Dcassandra.superuser_setup_delay_ms=0
-Dcassandra.skip_sync=true
-Djava.security.manager=allow
"""


def _jvm_options(nodes: int, auth: str) -> str:
    low, high = HEAPS.get(nodes, HEAPS[3])
    text = f"-Xms{low}\n-Xmx{high}\n-Xss256k\n-XX:+ExitOnOutOfMemoryError\n"
    text += _JVM_MODULE_FLAGS + _JVM_TEST_FLAGS + "".join(f"{flag}\n" for flag in jvm_jit_flags())
    if auth == "password" and nodes > 1:
        # the roles on every node (default: one replica), so a login
        # survives a node's stop; read when system_auth is first created
        text += f"-Dcassandra.system_auth.default_rf={nodes}\n"
    return text


_LOGBACK = """\
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter"><level>WARN</level></filter>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def initial_token(index: int, nodes: int) -> int:
    """Node ``index``'s token: the ring split evenly, each in the middle of
    its share (one node: 0; never Murmur3's minimum, which no key has)."""
    return -(1 << 63) + _TOKEN_SPAN * index // nodes + _TOKEN_SPAN // (2 * nodes)


def _yaml(node: "_Node", seed: str, cluster_name: str, nodes: int, storage_port: int, native_port: int,
          paxos_variant: str, auth: str) -> str:
    root = node.root
    authenticator = "PasswordAuthenticator" if auth == "password" else "AllowAllAuthenticator"
    return f"""\
cluster_name: {cluster_name}
num_tokens: 1
initial_token: {initial_token(node.index, nodes)}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seed}:{storage_port}"
listen_address: {node.host}
rpc_address: {node.host}
# a fresh cluster has no data to stream to a joining node, and bootstrap
# gives up when the seed's gossip is late (the ring delay, 1 s here)
auto_bootstrap: false
storage_port: {storage_port}
start_native_transport: true
native_transport_port: {native_port}
data_file_directories:
  - {root / "data"}
commitlog_directory: {root / "commitlog"}
saved_caches_directory: {root / "saved_caches"}
hints_directory: {root / "hints"}
cdc_raw_directory: {root / "cdc_raw"}
commitlog_sync: periodic
commitlog_sync_period: 10000ms
authenticator: {authenticator}
authorizer: AllowAllAuthorizer
auto_snapshot: false
# the cassandra adapter commits a transaction as one batch, and the default
# refuses batches above 50 KiB (smbd's registry writes more at once)
batch_size_fail_threshold: 16MiB
# the lowest Cassandra takes: the others hold a killed node down sooner
phi_convict_threshold: 5
storage_compatibility_mode: NONE
paxos_variant: {paxos_variant}
"""


def _client_tls(node: "_Node", tls: CassandraTls) -> str:
    """cassandra.yaml's client_encryption_options: the certificate and key
    put in a PKCS12 keystore (openssl) in the node's conf directory."""
    keystore = node.conf / "keystore.p12"
    openssl = _binary("openssl", "openssl")
    made = subprocess.run([openssl, "pkcs12", "-export", "-in", str(tls.cert), "-inkey", str(tls.key),
                           "-out", str(keystore), "-passout", f"pass:{KEYSTORE_PASSWORD}", "-name", "node"],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise CassandraError(f"openssl pkcs12 failed: {made.stderr.strip()}")
    return f"""\
client_encryption_options:
  enabled: true
  optional: false
  keystore: {keystore}
  keystore_password: {KEYSTORE_PASSWORD}
  store_type: PKCS12
  require_client_auth: false
"""


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Cassandra's netty binds
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_ports(hosts: Sequence[str], count: int) -> list[int]:
    """``count`` distinct ports free on every one of ``hosts``, below the
    kernel's ephemeral range (where outgoing connections would take them,
    and a restarted node could find its port gone)."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports: list[int] = []
    for _ in range(200):
        port = random.randrange(10000, low)
        if port not in ports and all(_bindable(h, port) for h in hosts):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise CassandraError(f"no {count} free ports on {', '.join(hosts)} below {low}")


def _without_memory_lock(argv: Sequence[str]) -> list[str]:
    """``argv`` run without CAP_IPC_LOCK, when we are root.

    Cassandra mlockall()s the JVM at startup, which as root succeeds and
    makes everything mapped by then resident: ~600 MB per node instead of
    ~420 MB, for nothing a throwaway node needs (it keeps pages from swap).
    Without the capability the call fails (RLIMIT_MEMLOCK, 8 MiB by default)
    and Cassandra logs one warning and goes on. It wraps dying_with_parent's
    setpriv, so the parent-death signal is set last, after the capabilities
    changed (both orders kept it here, but the kernel clears it on some
    credential changes).
    """
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:  # a user has no such capability to drop
        return list(argv)
    return [setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--", *argv]


# -- the cluster --------------------------------------------------------------------


class _Node:
    """One Cassandra node: its address, directory and (while it runs) process."""

    def __init__(self, index: int, root: Path, host: str) -> None:
        self.index = index
        self.host = host
        self.root = root
        self.conf = root / "conf"
        self.system_log = root / "logs" / "system.log"
        self.stdout_log = root / "logs" / "stdout.log"  # the JVM's own errors, and WARN and up
        self.process: subprocess.Popen[bytes] | None = None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class CassandraCluster:
    """``nodes`` Cassandra nodes on 127.0.0.1.. (one each), or one node on
    ``host``, every one in a temporary directory of its own."""

    def __init__(self, nodes: int = 1, *, paxos_variant: str = "v2", auth: str = "none",
                 tls: CassandraTls | None = None, start_timeout: float = 120.0, host: str | None = None) -> None:
        if not 1 <= nodes <= len(HOSTS):
            raise ValueError(f"a throwaway Cassandra has 1 to {len(HOSTS)} nodes, not {nodes}")
        if host is not None and nodes != 1:
            # several nodes on one address would need a storage port each, which Cassandra does not take
            raise CassandraError(f"a throwaway Cassandra on {host} has one node, not {nodes}")
        if paxos_variant not in PAXOS_VARIANTS:
            raise ValueError(f"paxos_variant must be one of {', '.join(PAXOS_VARIANTS)}, not {paxos_variant!r}")
        if auth not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}, not {auth!r}")
        self.nodes = nodes
        #: node i's address
        self.hosts: tuple[str, ...] = (host,) if host is not None else HOSTS[:nodes]
        self.paxos_variant = paxos_variant
        self.auth = auth
        #: client connections take TLS only (no plain CQL port)
        self.tls = tls
        #: seconds each node may take to be ready (a first download of the jars comes on top)
        self.start_timeout = start_timeout
        self.storage_port = 0
        self.native_port = 0
        self._nodes: list[_Node] = []
        self._lib: Path | None = None

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> "CassandraCluster":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start every node, one after another; return once the cluster is ready (see the module's docstring)."""
        _java()
        if self.nodes > 1 or self.auth != "none":
            _import_driver()  # before minutes of download and start, not after
        self._lib = jars()
        for attempt in range(3):  # a port taken between the check and a node's bind: new ports
            try:
                self._create()
                RUNNING[self.contact_points] = self
                return
            except CassandraError as exc:
                logs = self.log_tail()
                self.stop()
                if "Address already in use" not in logs or attempt == 2:
                    raise CassandraError(f"{exc}\n{logs}") from None
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Kill every node by PID (SIGKILL: its data goes anyway), then remove their directories."""
        if self._nodes:
            RUNNING.pop(self.contact_points, None)
        for node in self._nodes:
            self._kill(node, signal.SIGKILL)
        for node in self._nodes:
            shutil.rmtree(node.root, ignore_errors=True)
        self._nodes = []

    # -- what tests use -----------------------------------------------------

    @property
    def contact_points(self) -> str:
        return ",".join(f"{node.host}:{self.native_port}" for node in self._nodes)

    def options(self) -> dict[str, str]:
        """The cassandra adapter's options that reach this cluster."""
        options = {"contact_points": self.contact_points, "replication_factor": str(self.nodes)}
        if self.tls is not None:
            options["tls_ca"] = str(self.tls.ca)
        if self.auth == "password":
            options.update(user=SUPERUSER[0], password=SUPERUSER[1])
            if self.tls is None:  # a throwaway on this host's addresses
                options["allow_plaintext"] = "yes"
        return options

    def host(self, index: int) -> str:
        return self._node(index).host

    def root(self, index: int) -> Path:
        """Node ``index``'s directory (conf, data, logs)."""
        return self._node(index).root

    def pid(self, index: int) -> int | None:
        node = self._node(index)
        return node.process.pid if node.process is not None and node.running() else None

    def stop_node(self, index: int, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Stop node ``index`` by PID with ``sig`` (SIGKILL: a crash) and reap it."""
        self._kill(self._node(index), sig, timeout)

    def pause_node(self, index: int) -> None:
        """SIGSTOP: the node keeps its sockets but answers nothing (a long GC pause)."""
        pid = self.pid(index)
        if pid is not None:
            pause_process(pid)

    def resume_node(self, index: int) -> None:
        pid = self.pid(index)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def start_node(self, index: int, wait: bool = True, timeout: float | None = None) -> None:
        """Start a stopped node again on its data directory; with ``wait``,
        return once the cluster is ready again (every running node sees it).

        The node dies with the thread that calls this (PR_SET_PDEATHSIG
        follows the thread that forked): call it from one that outlives it.
        """
        node = self._node(index)
        if node.running():
            raise CassandraError(f"node {index} ({node.host}) is running")
        self._spawn(node)
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every running node takes CQL and, with more than one
        node, every running one reads at a consistency level of all running
        ones; CassandraError with every node's log tail if one exited or the
        time ran out."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        try:
            for node in self._nodes:
                if node.process is not None:
                    self._wait_port(node, deadline)
            self._wait_cql(deadline)
        except CassandraError as exc:
            raise CassandraError(f"{exc}\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` of each node's system.log and stdout.log."""
        return log_tails(((f"node {node.index} ({node.host})", path)
                          for node in self._nodes for path in (node.stdout_log, node.system_log)), lines)

    def rss_kib(self) -> dict[int, int]:
        """Each running node's resident set size (KiB), by index."""
        sizes = {}
        for node in self._nodes:
            if node.process is None or not node.running():
                continue
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        sizes[node.index] = int(line.split()[1])
        return sizes

    # -- creating it ----------------------------------------------------------

    def _create(self) -> None:
        self.storage_port, self.native_port = _free_ports(self.hosts, 2)
        # a node refuses gossip from another cluster's, should ports ever be reused across clusters
        name = f"dbwrap_py_{uuid.uuid4().hex[:12]}"
        self._nodes = []
        for index in range(self.nodes):
            node = _Node(index, Path(tempfile.mkdtemp(prefix=f"dbwrap-py-cassandra-{index}-")), self.hosts[index])
            self._nodes.append(node)
            for sub in ("conf", "data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs", "tmp"):
                (node.root / sub).mkdir()
            (node.conf / "cassandra.yaml").write_text(
                _yaml(node, self.hosts[0], name, self.nodes, self.storage_port, self.native_port,
                      self.paxos_variant, self.auth)
                + (_client_tls(node, self.tls) if self.tls is not None else ""))
            (node.conf / "logback.xml").write_text(_LOGBACK.format(log=node.system_log))
            (node.conf / "jvm.options").write_text(_jvm_options(self.nodes, self.auth))
        # one at a time: the seed first, then each node joins a ring that has settled
        for node in self._nodes:
            deadline = time.monotonic() + self.start_timeout
            self._spawn(node)
            self._wait_port(node, deadline)
        self._wait_cql(time.monotonic() + self.start_timeout)

    def _spawn(self, node: _Node) -> None:
        assert self._lib is not None
        java = _java()
        argv = [
            java, f"@{node.conf / 'jvm.options'}",
            f"-Dcassandra.config={(node.conf / 'cassandra.yaml').as_uri()}",
            f"-Dcassandra.storagedir={node.root}",
            f"-Dlogback.configurationFile={node.conf / 'logback.xml'}",
            # lz4-java unpacks its library there at every start: gone with the node
            f"-Djava.io.tmpdir={node.root / 'tmp'}",
            "-cp", f"{self._lib}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ]
        with open(node.stdout_log, "ab") as out:
            node.process = subprocess.Popen(
                _without_memory_lock(dying_with_parent(argv)),
                cwd=node.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # a terminal's Ctrl-C reaches us; we stop nodes by PID
            )

    def _kill(self, node: _Node, sig: int, timeout: float = 30.0) -> None:
        process = node.process
        if process is None:
            return
        stop_process(process, sig, timeout)
        node.process = None

    def _node(self, index: int) -> _Node:
        if not 0 <= index < len(self._nodes):
            raise CassandraError(f"no node {index} (the cluster has {len(self._nodes)})")
        return self._nodes[index]

    def _check_alive(self, node: _Node) -> None:
        if node.process is not None and node.process.poll() is not None:
            raise CassandraError(f"node {node.index} ({node.host}) exited with status {node.process.returncode}")

    # -- readiness ----------------------------------------------------------------

    def _wait_port(self, node: _Node, deadline: float) -> None:
        """Until the node's native port takes a connection: it opens last in startup."""
        while True:
            self._check_alive(node)
            with contextlib.suppress(OSError), socket.create_connection((node.host, self.native_port), 0.5):
                return
            if time.monotonic() > deadline:
                raise CassandraError(f"node {node.index} ({node.host}) did not open its native port"
                                     f" {self.native_port} in time")
            time.sleep(0.1)

    def _wait_cql(self, deadline: float) -> None:
        """With auth, until every running node logs the superuser in; with
        more than one node, until every running node reads a
        system_distributed partition at a consistency level of all running
        nodes (then each knows every other one and sees it up)."""
        if self.nodes == 1 and self.auth == "none":
            return
        driver = _import_driver()
        running = [node for node in self._nodes if node.running()]

        def ready(session: Any) -> None:
            # local tables: read at ONE whatever the cluster's size
            peers = {str(row.peer): row.schema_version
                     for row in session.execute("SELECT peer, schema_version FROM system.peers")}
            if len(peers) != self.nodes - 1:
                raise CassandraError(f"system.peers lists {len(peers)} peers, not {self.nodes - 1}")
            # a node that missed a schema change (down meanwhile) pulls it after its start
            ours = session.execute("SELECT schema_version FROM system.local").one().schema_version
            behind = sorted(n.host for n in running if n.host in peers and peers[n.host] != ours)
            if behind:
                raise CassandraError(f"no schema agreement yet: {', '.join(behind)} not on {ours}")
            if self.nodes > 1:
                session.execute(driver.SimpleStatement(_PROBE, consistency_level=driver.CONSISTENCY[len(running)]))

        self._each_until(running, deadline, "not ready", ready)

    def wait_down(self, index: int, timeout: float = 60.0) -> None:
        """Until every other running node holds node ``index`` down.

        A SIGKILLed node is down for the others only once their failure
        detector convicts it (seconds); until then a read or write that
        needs it waits out Cassandra's timeout instead of failing at once
        with Unavailable. Call this after stop_node() for the second case.
        """
        driver = _import_driver()
        node = self._node(index)
        if node.running():
            raise CassandraError(f"node {index} ({node.host}) is running")

        def sees_it_down(session: Any) -> None:
            statement = driver.SimpleStatement(_PROBE, consistency_level=driver.ALL)
            try:
                session.execute(statement, timeout=1.0)  # (a replica it thinks up keeps it waiting)
            except driver.Unavailable:
                return
            except driver.Error:
                pass
            raise CassandraError(f"node {index} ({node.host}) is not down in its view")

        others = [n for n in self._nodes if n.running()]
        try:
            self._each_until(others, time.monotonic() + timeout, "still sees", sees_it_down)
        except CassandraError as exc:
            raise CassandraError(f"{exc}\n{self.log_tail()}") from None

    def _each_until(self, nodes: Sequence[_Node], deadline: float, failing: str,
                    check: Callable[[Any], None]) -> None:
        """Run ``check`` on a session to each of ``nodes`` (that node the
        coordinator) until it passes; CassandraError once ``deadline`` passed."""
        driver = _import_driver()
        for node in nodes:
            last = "no attempt"
            while True:
                self._check_alive(node)
                try:
                    with self._session(node) as session:
                        check(session)
                    break
                except CassandraError as exc:
                    last = str(exc)
                except driver.Error as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() > deadline:
                    raise CassandraError(f"node {node.index} ({node.host}) {failing} in time: {last}")
                time.sleep(0.2)

    @contextlib.contextmanager
    def _session(self, node: _Node) -> Iterator[Any]:
        """A driver session that sends everything to ``node``, and tries nothing twice."""
        driver = _import_driver()
        profile = driver.ExecutionProfile(load_balancing_policy=driver.WhiteListRoundRobinPolicy([node.host]),
                                          retry_policy=driver.FallthroughRetryPolicy(), request_timeout=5.0)
        auth = driver.PlainTextAuthProvider(*SUPERUSER) if self.auth == "password" else None
        tls = None
        if self.tls is not None:  # readiness only: the host name is the adapter's to check (tests
            tls = ssl.create_default_context(cafile=str(self.tls.ca))  # give a wrong one on purpose)
            tls.check_hostname = False
        cluster = driver.Cluster([node.host], port=self.native_port, protocol_version=5,
                                 execution_profiles={driver.EXEC_PROFILE_DEFAULT: profile}, ssl_context=tls,
                                 auth_provider=auth, connect_timeout=2.0, control_connection_timeout=2.0,
                                 schema_metadata_enabled=False, token_metadata_enabled=False)
        try:
            yield cluster.connect()  # with auth: the superuser exists
        finally:
            cluster.shutdown()


#: a partition with a replica on every node (system_distributed has RF 3);
#: (keyspace_name, view_name) is its key, and the row need not exist
_PROBE = ("SELECT host_id FROM system_distributed.view_build_status"
          " WHERE keyspace_name = 'dbwrap_py' AND view_name = 'probe'")


class _Driver:
    """The parts of the Python driver (cassandra-driver) the probes use."""

    def __init__(self) -> None:
        from cassandra import ConsistencyLevel, DriverException, Unavailable
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
        from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy
        from cassandra.query import SimpleStatement

        self.Cluster = Cluster
        self.ExecutionProfile = ExecutionProfile
        self.EXEC_PROFILE_DEFAULT = EXEC_PROFILE_DEFAULT
        self.PlainTextAuthProvider = PlainTextAuthProvider
        self.WhiteListRoundRobinPolicy = WhiteListRoundRobinPolicy
        self.SimpleStatement = SimpleStatement
        self.FallthroughRetryPolicy = FallthroughRetryPolicy
        self.Unavailable = Unavailable
        self.ALL = ConsistencyLevel.ALL
        #: the consistency level that needs this many replicas
        self.CONSISTENCY = {1: ConsistencyLevel.ONE, 2: ConsistencyLevel.TWO, 3: ConsistencyLevel.THREE}
        # what a probe of a node that is not ready yet raises
        self.Error: tuple[type[BaseException], ...] = (DriverException, NoHostAvailable, OSError)


_DRIVER: _Driver | None = None


def _import_driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        try:
            _DRIVER = _Driver()
        except ImportError:
            raise CassandraError("no cassandra Python driver (pip install -r tests/requirements.txt:"
                                 " cassandra-driver)") from None
    return _DRIVER


@contextlib.contextmanager
def throwaway_cluster(nodes: int = 1, *, paxos_variant: str = "v2", auth: str = "none",
                      host: str | None = None) -> Iterator[dict[str, str]]:
    """A cluster for as long as the block runs, on the loopback or (one
    node) on ``host``; yields the cassandra adapter's options."""
    with CassandraCluster(nodes=nodes, paxos_variant=paxos_variant, auth=auth, host=host) as cluster:
        yield cluster.options()


def main(argv: Sequence[str] | None = None) -> int:
    """A throwaway Cassandra of ``--nodes`` nodes until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m dbwrap_py.testing.servers.cassandra",
        description="a throwaway Apache Cassandra on 127.0.0.1-3 until SIGTERM or Ctrl-C")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    parser.add_argument("--paxos-variant", default="v2", choices=PAXOS_VARIANTS)
    parser.add_argument("--auth", default="none", choices=AUTH_MODES)
    args = parser.parse_args(argv)

    def banner(cluster: CassandraCluster) -> str:
        nodes = "; ".join(f"{cluster.host(i)} pid {cluster.pid(i)} in {cluster.root(i)}"
                          for i in range(cluster.nodes))
        options = " ".join(f"-o {k}={v}" for k, v in cluster.options().items())
        return (f"cassandra {VERSION}, {cluster.nodes} node(s), paxos {cluster.paxos_variant}: {nodes}\n"
                f"  use: {options}")

    serve_until_stopped(CassandraCluster(nodes=args.nodes, paxos_variant=args.paxos_variant, auth=args.auth),
                        banner)
    return 0


class CassandraHooks(LeasedHooks):
    """The cassandra adapter's test hooks, and the scylla dialect's
    (dbwrap_py.testing.hooks). A node agent's lease is at least 3 s: a
    whole-second TTL grants a second less (_cassandra_ownership), and at 2 s
    the lease an agent publishes would lapse between its keepalives."""

    def throwaway_server(self, options: Mapping[str, str]) -> AbstractContextManager[dict[str, str]] | None:
        """A one-node Cassandra, when no contact_points are given
        (``throwaway_host``: where it listens; not an adapter option)."""
        if options.get("contact_points"):
            return None
        host = options.get("throwaway_host")
        return throwaway_cluster(host=str(host) if host else None)


HOOKS = CassandraHooks("cassandra", minimum=3.0)


if __name__ == "__main__":
    raise SystemExit(main())
