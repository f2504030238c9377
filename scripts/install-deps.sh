#!/bin/sh
# Install the Debian packages dbwrap_py needs, only those that are missing,
# with one apt-get update before the first install. Idempotent and quick
# when everything is there already.
set -eu

packages="
  build-essential pkg-config
  python3 python3-dev python3-venv python3-tdb
  libtalloc-dev libtdb-dev tdb-tools
  samba samba-testsuite smbclient
  etcd-server openssl
"

# A Go toolchain builds the linearizability checker; Debian's is enough
# (go.mod asks for 1.19), but a newer one already on PATH is used as it is.
if ! command -v go >/dev/null 2>&1; then
    packages="$packages golang-go"
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
