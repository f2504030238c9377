# test-fresh: the host's own tools, installed only when missing.
# Sourced by scripts/test-fresh.sh.

# Installs the Debian packages behind the given commands ("command:package"),
# those missing only, with apt-get update only if something must be installed.
# Another apt run on this machine (install-deps) may hold the lock: wait for it.
need_host_commands() {
    local pair missing=""
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing="$missing ${pair#*:}"
    done
    [ -n "$missing" ] || return 0
    echo "test-fresh: installing on the host:$missing"
    DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 update
    DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 \
        install --no-install-recommends $missing
}
