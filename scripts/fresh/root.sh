# test-fresh: the bare Debian root (FRESH_SUITE: bookworm, the default,
# trixie, or sid for Samba 4.25). debootstrap's minbase plus make (one needs it to type `make`),
# nothing more: whatever else the project needs, its own commands must
# install. Cached as a tar.zst, so that later runs re-create the root in
# about a second.
# Sourced by scripts/test-fresh.sh.

fresh_suite=${FRESH_SUITE:-bookworm}
fresh_cache=${XDG_CACHE_HOME:-$HOME/.cache}/dbwrap_py/fresh-$fresh_suite-minbase.tar.zst

# The suite this machine runs (its apt sources name it): another suite's
# root gets the same sources with the suite names changed.
host_suite() {
    . /etc/os-release && echo "$VERSION_CODENAME"
}

# The mirror this machine's apt uses for its own suite, so that no registry is
# named here: the first URI of an enabled deb822 stanza (sources.list.d/*.sources)
# whose Suites include it, else of a one-line `deb` entry (sources.list, *.list).
# Debian's mirrors carry every suite, so the root's suite comes from it too.
host_mirror() {
    local uri suite
    suite=$(host_suite)
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$suite" '
        function stanza_end() {
            if (!found && types ~ "(^| )deb( |$)" && suites ~ "(^| )" suite "( |$)" &&
                enabled != "no" && uris != "") { split(uris, u, " "); print u[1]; found = 1 }
            types = suites = uris = enabled = ""
        }
        /^#/ { next }
        /^[ \t]*$/ { stanza_end(); next }
        /^[A-Za-z-]+:/ {
            key = tolower(substr($0, 1, index($0, ":") - 1))
            val = substr($0, index($0, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", val)
            if (key == "types") types = val; else if (key == "uris") uris = val
            else if (key == "suites") suites = val; else if (key == "enabled") enabled = tolower(val)
        }
        END { stanza_end() }')
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v suite="$suite" '
            { sub(/#.*/, ""); gsub(/\[[^]]*\]/, "") }
            $1 == "deb" && $3 == suite { print $2; exit }')
    fi
    [ -n "$uri" ] || { echo "test-fresh: no apt source for $suite on this host" >&2; return 1; }
    echo "$uri"
}

# debootstrap's minbase plus make, then without what a fresh machine has not
# fetched yet (package lists, .debs) or takes from the host on each run (DNS).
build_minbase() {
    local root=$1 mirror
    mirror=$(host_mirror)
    echo "test-fresh: debootstrap --variant=minbase --include=make $fresh_suite from $mirror"
    debootstrap --variant=minbase --include=make "$fresh_suite" "$root" "$mirror"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
           "$root"/var/cache/apt/archives/*.deb "$root/etc/resolv.conf"
    mkdir -p "$root/var/lib/apt/lists/partial"
}

# Written beside the cache and renamed, so an interrupted run leaves no half cache.
save_minbase() {
    local root=$1 tmp
    mkdir -p "$(dirname "$fresh_cache")"
    tmp=$fresh_cache.$$.tmp
    tar --numeric-owner --xattrs --xattrs-include='*' --acls --one-file-system \
        -C "$root" -cf - . | zstd -q -T0 -3 > "$tmp"
    mv "$tmp" "$fresh_cache"
    echo "test-fresh: cached the root as $fresh_cache ($(du -h "$fresh_cache" | cut -f1))"
}

# A cached root ($1, a .tar.zst) unpacked into the folder $2.
restore_tarball() {
    local tarball=$1 root=$2
    echo "test-fresh: the root from $tarball"
    zstd -q -dc "$tarball" |
        tar --numeric-owner --xattrs --xattrs-include='*' --acls -C "$root" -xpf -
}

# FRESH_PREPARED=1 (CI's Debian 13 and sid steps, which prove the platform;
# make test-fresh proves the set-up from a bare Debian 12 root on every CI
# run): the root also keeps the Debian packages `make deps` installed,
# cached per suite and per content of scripts/install-deps.sh, so a change
# to the list builds it again from the bare root. Later runs skip apt's
# downloads and unpacking: 4.5-5.2 min of `make demo` in those roots. A
# cache older than a week is made again, so the packages follow the suite.
prepared_cache() {
    local list
    list=$(sha256sum "$checkout/scripts/install-deps.sh" | cut -c1-12)
    echo "${fresh_cache%-minbase.tar.zst}-deps-$list.tar.zst"
}

# The root after `make deps`, without the checkout, the mounts' contents,
# the downloaded .debs and the host's DNS; older lists' caches go. tar's
# status 1 is a file that changed while read (a mount point's directory,
# a log): the packages' files do not change once dpkg is done.
save_prepared() {
    local root=$1 cache tmp
    cache=$(prepared_cache)
    tmp=$cache.$$.tmp
    if ! { rc=0
           tar --numeric-owner --xattrs --xattrs-include='*' --acls --one-file-system \
               --warning=no-file-changed --exclude=./root/work --exclude='./proc/*' --exclude='./sys/*' \
               --exclude='./dev/pts/*' --exclude='./dev/shm/*' --exclude='./tmp/*' \
               --exclude='./var/cache/apt/archives/*.deb' --exclude=./etc/resolv.conf \
               -C "$root" -cf - . || rc=$?
           [ "$rc" -le 1 ]; } | zstd -q -T0 -3 > "$tmp"; then
        rm -f "$tmp"
        echo "test-fresh: could not cache the root with its packages (tar or zstd said why above)" >&2
        return 1
    fi
    mv "$tmp" "$cache"
    find "$(dirname "$cache")" -maxdepth 1 -name "fresh-$fresh_suite-deps-*.tar.zst" ! -path "$cache" -delete
    echo "test-fresh: cached the root with its packages as $cache ($(du -h "$cache" | cut -f1))"
}

prepared_wanted() {
    [ "${FRESH_PREPARED:-0}" = 1 ] && [ "${FRESH_CACHE:-1}" != 0 ]
}

# Whether the prepared cache is there and less than a week old.
prepared_fresh() {
    [ -n "$(find "$(prepared_cache)" -maxdepth 0 -mtime -7 2>/dev/null)" ]
}

# The root in $1 (an empty folder): with FRESH_PREPARED=1 from the prepared
# cache when there is one; else from the bare cache, or built and cached
# when there is none or FRESH_CACHE=0 asks for a cold run.
create_root() {
    local root=$1
    if prepared_wanted && prepared_fresh; then
        restore_tarball "$(prepared_cache)" "$root"
    elif [ "${FRESH_CACHE:-1}" != 0 ] && [ -s "$fresh_cache" ]; then
        restore_tarball "$fresh_cache" "$root"
    else
        need_host_commands debootstrap:debootstrap
        build_minbase "$root"
        save_minbase "$root"
    fi
}
