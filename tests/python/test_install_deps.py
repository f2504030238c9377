"""Every file the project runs or links is installed by scripts/install-deps.sh.

Packages go in without their Recommends, so a file that arrives on this
machine only by a Recommends (as samba-vfs-modules does for samba) would be
missing on a fresh one. Each file must come from a package the script
names, from one those depend on (Depends and Pre-Depends, recursively, as
apt installs them), or from one of Priority required (every Debian root
has those).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MULTIARCH = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True).stdout.strip()
SAMBA = f"/usr/lib/{MULTIARCH}/samba"
#: the interpreter the bridge embeds is the one running this (the venv's base)
PY = f"python3.{sys.version_info.minor}"
PY_TAG = f"cpython-3{sys.version_info.minor}"


def dbwrap_library() -> str:
    """Samba's private dbwrap library: Debian 12's name, else Debian 13's."""
    old = f"{SAMBA}/libdbwrap-samba4.so.0"
    return old if Path(old).exists() else f"{SAMBA}/libdbwrap-private-samba.so.0"


def gcc_file(name: str) -> str:
    """Where gcc finds a library it links (its sanitizers' runtimes)."""
    return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True,
                          text=True).stdout.strip()


#: what the project uses, and where: (file, used by)
USED_FILES = [
    ("/usr/sbin/smbd", "ThrowawaySamba"),
    (f"{SAMBA}/vfs/acl_xattr.so", "the throwaway share's vfs objects"),
    (f"{SAMBA}/vfs/streams_xattr.so", "the throwaway share's vfs objects"),
    (dbwrap_library(), "the C suite and dbwrap_check link Samba's dbwrap"),
    (f"/usr/lib/{MULTIARCH}/libsmbconf.so.0", "the preload library's real db_open"),
    (f"/usr/lib/{MULTIARCH}/libsamba-errors.so.1", "NTSTATUS names in the C programs"),
    ("/usr/bin/smbtorture", "make test's comparisons, make demo, make bench"),
    ("/usr/bin/smbclient", "tests/smb"),
    ("/usr/bin/smbpasswd", "ThrowawaySamba adds its user"),
    ("/usr/bin/pdbedit", "tests/smb"),
    ("/usr/bin/net", "tests/smb: net conf, net groupmap"),
    ("/usr/bin/sharesec", "tests/smb"),
    ("/usr/bin/testparm", "configs tests, dbwrap-py copy"),
    ("/usr/bin/smbstatus", "the README's debugging steps"),
    ("/usr/bin/dbwrap_tool", "the README's debugging steps"),
    ("/usr/bin/tdbdump", "tdb adapter tests"),
    ("/usr/bin/etcd", "the throwaway etcd"),
    ("/usr/bin/openssl", "the etcd TLS tests"),
    ("/usr/bin/ceph-mon", "the throwaway Ceph (python/dbwrap_py/testing/servers/rados.py)"),
    ("/usr/bin/ceph-osd", "the throwaway Ceph"),
    ("/usr/bin/monmaptool", "the throwaway Ceph's initial monitor map"),
    ("/usr/bin/ceph", "looking into a throwaway Ceph (its banner says how)"),
    (f"/usr/lib/{MULTIARCH}/rados-classes/libcls_lock.so", "the rados adapter's record locks"),
    (f"/usr/lib/python3/dist-packages/rados.{PY_TAG}-{MULTIARCH}.so",
     "the rados Python binding (rados adapter, throwaway Ceph's probes)"),
    ("/usr/share/java/zookeeper.jar", "the throwaway ZooKeeper (dbwrap_py.testing.servers.zookeeper)"),
    ("/usr/lib/python3/dist-packages/kazoo/client.py", "kazoo, the zookeeper adapter's client"),
    ("/usr/lib/python3/dist-packages/prometheus_client/exposition.py", "the agent's and the daemon's metrics"),
        ("/usr/bin/java", "the throwaway Cassandra (python/dbwrap_py/testing/servers/cassandra.py)"),
    ("/usr/bin/mvn", "the throwaway Cassandra's jars, from Maven Central"),
    ("/usr/bin/valgrind", "make test-memcheck, make bench-bridge"),
    ("/usr/sbin/useradd", "ThrowawaySamba's unix user"),
    ("/sbin/ip", "the cluster's network namespaces (make test-cluster-torture-failover)"),
    ("/sbin/ethtool", "ctdb's 10.interface: the public interface's link"),
    ("/usr/sbin/nft", "the TCP delay relay's redirect (cluster/tcp_delay.py)"),
    ("/usr/include/samba-4.0/libsmbclient.h", "build/smb_open_loop, make bench-elastic's SMB client"),
    (f"/usr/lib/{MULTIARCH}/libsmbclient.so", "build/smb_open_loop links it"),
    ("/usr/include/talloc.h", "the bridge and the tdb adapter's C extension"),
    ("/usr/include/tdb.h", "the bridge and the tdb adapter's C extension"),
    (f"/usr/lib/{MULTIARCH}/libtdb.so", "the bridge and the tdb adapter's C extension link it"),
    (f"/usr/lib/{MULTIARCH}/libtalloc.so", "the bridge and the tdb adapter's C extension link it"),
    (f"/usr/include/{PY}/Python.h", "the bridge embeds CPython"),
    ("/usr/bin/python3-config", "the Makefile's Python flags"),
    ("/usr/bin/pkg-config", "the Makefile's talloc and tdb flags"),
    ("/usr/bin/gcc", "the Makefile"),
    (gcc_file("libasan.so"), "build/proxy_client's AddressSanitizer (the C client's tests and fuzzer)"),
    (gcc_file("libubsan.so"), "build/proxy_client's UBSan"),
    ("/usr/bin/make", "the Makefile"),
    ("/usr/lib/python3/dist-packages/wheel/bdist_wheel.py", "pip's editable install (bdist_wheel)"),
    ("/usr/sbin/update-ca-certificates", "pip and Go modules over HTTPS"),
]


@functools.cache
def listed_packages() -> frozenset[str]:
    out = subprocess.run([str(REPO / "scripts" / "install-deps.sh"), "--list"],
                         capture_output=True, text=True, check=True).stdout
    return frozenset(out.split())


@functools.cache
def installed_with_them() -> frozenset[str]:
    """The named packages and everything apt installs with them, Recommends left out."""
    out = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
         *sorted(listed_packages())], capture_output=True, text=True, check=True).stdout
    names = {line.strip() for line in out.splitlines() if not line.startswith(" ")}
    names |= {line.split(":", 1)[1].strip() for line in out.splitlines()
              if line.strip().startswith(("Depends:", "PreDepends:"))}
    return frozenset(n.split(":")[0] for n in names if not n.startswith("<"))


def owners(path: str) -> set[str]:
    """The Debian packages that ship ``path`` (following symlinks), or none."""
    found: set[str] = set()
    for candidate in {path, str(Path(path).resolve())}:
        result = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        for line in result.stdout.splitlines():
            packages = line.split(": ", 1)[0]
            found |= {p.strip().split(":")[0] for p in packages.split(",")}
    return found


def required(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Priority}", package],
                            capture_output=True, text=True)
    return result.stdout.strip() == "required"


@pytest.mark.parametrize("path, used_by", USED_FILES, ids=[p for p, _ in USED_FILES])
def test_each_file_comes_from_a_named_or_required_package(path, used_by):
    assert Path(path).exists(), f"{path} ({used_by}) is missing on this machine"
    packages = owners(path)
    assert packages, f"{path} ({used_by}) belongs to no Debian package"
    assert packages & installed_with_them() or any(required(p) for p in packages), \
        f"{path} ({used_by}) comes from {', '.join(sorted(packages))}, which" \
        " scripts/install-deps.sh does not install (a Recommends is not enough)"


def test_a_recommends_alone_does_not_count():
    """The check itself: samba-vfs-modules is only recommended by samba."""
    assert "samba-vfs-modules" in listed_packages()
    out = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
                          "samba", "samba-testsuite"], capture_output=True, text=True).stdout
    assert "samba-vfs-modules" not in out


def test_go_is_installed_when_missing():
    go = shutil.which("go")
    script = (REPO / "scripts" / "install-deps.sh").read_text()
    assert 'packages="$packages golang-go"' in script
    if go and owners(go):
        assert "golang-go" in listed_packages() or owners(go) & {"golang-go", "golang-1.19-go"}
