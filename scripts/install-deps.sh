#!/bin/sh
# Install the Debian packages dbwrap_py needs, only those that are missing,
# with one apt-get update before the first install. Idempotent and quick
# when everything is there already.
#
# Packages go in with --no-install-recommends, so every package whose files
# the project uses is named here, not left to a Recommends: samba only
# recommends samba-vfs-modules, without which the throwaway share
# (vfs objects = acl_xattr streams_xattr) refuses every tree connect.
# tests/python/test_install_deps.py checks each file against this list.
set -eu

packages="
  build-essential pkg-config
  python3 python3-dev python3-venv python3-wheel python3-setuptools
  libtalloc-dev libtdb-dev tdb-tools libsmbclient-dev
  samba samba-common-bin samba-vfs-modules samba-testsuite smbclient ctdb iproute2 ethtool nftables
  etcd-server openssl valgrind
  zookeeper python3-kazoo
  python3-prometheus-client
  ceph-mon ceph-osd ceph-common python3-rados
  maven
  ca-certificates
  debhelper python3-pip
"
# What each is for:
#   build-essential, pkg-config      the bridge, the preload library, the C tests; gcc's
#                                    libasan and libubsan (its Depends) for build/proxy_client
#   python3, python3-dev             the interpreter the bridge embeds, and its headers
#   python3-venv                     the .venv (pip and setuptools wheels)
#   python3-wheel                    bdist_wheel for the venv's setuptools (66), which
#                                    `pip install --no-build-isolation -e .` needs
#   python3-setuptools               setuptools for that install on Python 3.12 and
#                                    later (Debian 13), whose venvs come without it
#   libtalloc-dev, libtdb-dev        talloc and tdb headers and libraries for the bridge
#                                    and the tdb adapter's C extension
#   tdb-tools                        tdbdump, tdbtool: reading tdb files in tests
#   samba                            smbd, smbstatus, pdbedit, sharesec, and Samba's
#                                    private libraries (libdbwrap-samba4, on Debian 13
#                                    libdbwrap-private-samba; libsmbconf)
#   samba-common-bin                 net, smbpasswd, testparm, dbwrap_tool
#   samba-vfs-modules                acl_xattr and streams_xattr, on the test share
#   samba-testsuite                  smbtorture
#   smbclient                        smbclient, the tests' SMB client
#   libsmbclient-dev                 libsmbclient's header and library: build/smb_open_loop,
#                                    make bench-elastic's SMB client (0.5 s bins)
#   ctdb                             ctdbd and the ctdb CLI: the three-node cluster
#                                    (dbwrap_py.cluster), its messaging and its baseline
#   iproute2                         ip netns, veth and bridge: the cluster's public
#                                    addresses (make test-cluster-torture-failover)
#   ethtool                          ctdb's 10.interface event script: the link of
#                                    the interface a public address goes on
#   nftables                         nft: the TCP delay relay's redirect, for a cluster's
#                                    network profile where the kernel has no netem
#   etcd-server                      the throwaway etcd of the etcd adapter's tests
#   openssl                          certificates for the etcd TLS tests
#   zookeeper                        the throwaway ZooKeeper of the zookeeper adapter
#                                    (its jars; run by dbwrap_py.testing.servers.zookeeper)
#   python3-kazoo                    kazoo, the zookeeper adapter's client (a venv with
#                                    system site packages sees it)
#   python3-prometheus-client        prometheus_client: the metrics of the node agent and
#                                    the proxy daemon (--metrics-port; imported only then)
#   ceph-mon                         ceph-mon, the throwaway Ceph's monitor; its dependency
#                                    ceph-base brings monmaptool and the OSDs' object
#                                    classes (cls lock: the rados adapter's record locks)
#   ceph-osd                         ceph-osd, the throwaway Ceph's memstore OSDs
#   ceph-common                      the ceph and rados CLIs, for looking into a throwaway
#                                    Ceph (ceph -c CONF osd dump); ceph-osd pre-depends on it
#   python3-rados                    the rados Python binding: the rados adapter and the
#                                    throwaway Ceph's own probes (a venv with system
#                                    site packages sees it)
#   openjdk-17-jre-headless          java for the throwaway Cassandra (5.0 runs on JDK 11
#                                    or 17; python/dbwrap_py/testing/servers/cassandra.py); Debian 13 has
#                                    no 17, and there openjdk-21-jre-headless runs it
#   maven                            mvn fetches the throwaway Cassandra's jars from Maven
#                                    Central once (Debian packages no Cassandra)
#   valgrind                         memcheck over the C suite (make test-memcheck),
#                                    callgrind for make bench-bridge
#   ca-certificates                  pip and the Go module proxy over HTTPS
#   debhelper                        make deb: dh and its helpers (packaging/debian/rules)
#   python3-pip                      make deb: the system python3's pip installs the
#                                    package into the .deb's tree (the venv has its own)

. /etc/os-release
if [ "${VERSION_ID:-}" = 12 ]; then
    packages="$packages openjdk-17-jre-headless"
else
    packages="$packages openjdk-21-jre-headless"
fi

# A Go toolchain builds the linearizability checker; Debian's is enough
# (go.mod asks for 1.19), but a newer one already on PATH is used as it is.
if ! command -v go >/dev/null 2>&1; then
    packages="$packages golang-go"
fi

# --list: the packages, one per line (tests/python/test_install_deps.py reads them)
if [ "${1:-}" = "--list" ]; then
    printf '%s\n' $packages
    exit 0
fi

missing=""
for pkg in $packages; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing Debian packages:$missing (run as root, or install them)" >&2
    exit 1
fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# smbd must not start as a system service (tests run their own), so hold
# service starts off for the install unless the machine already does.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -q --no-install-recommends $missing
