# test-fresh: the root reaches the package registries the way this machine
# does. Everything is read from the host at run time, so no registry is named
# in the project: apt's sources and configuration, DNS, the extra CA
# certificates (this machine's egress uses its own CA, and pip and the Go
# module proxy must trust it), pip's configuration.
# Sourced by scripts/test-fresh.sh.

# The host's apt sources replace the one line debootstrap wrote (which lacks
# -updates and -security); keyrings they may point at come along. A root of
# another suite gets them with the host's suite renamed (bookworm-security
# becomes trixie-security, and so on).
copy_apt_sources() {
    local root=$1 f from to
    from=$(host_suite) to=$fresh_suite
    [ "$to" != sid ] || { sid_apt_sources "$root"; return; }
    rm -f "$root/etc/apt/sources.list"
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
        [ -e "$f" ] || continue
        sed "s/\\b$from\\b/$to/g" "$f" > "$root$f"
    done
    for f in /etc/apt/trusted.gpg.d /etc/apt/keyrings; do
        [ ! -d "$f" ] || { mkdir -p "$root$f"; cp -a "$f/." "$root$f/"; }
    done
}

# sid (Samba 4.25) has no -updates or -security suites: one source, the
# host's mirror. Its Release file is past its Valid-Until date on this
# machine's clock, which apt refuses unless told not to check.
sid_apt_sources() {
    local root=$1 keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    rm -f "$root/etc/apt/sources.list"
    mkdir -p "$root/etc/apt/sources.list.d" "$root/etc/apt/apt.conf.d"
    printf 'Types: deb\nURIs: %s\nSuites: sid\nComponents: main\nSigned-By: %s\n' \
        "$(host_mirror)" "$keyring" > "$root/etc/apt/sources.list.d/debian.sources"
    echo 'Acquire::Check-Valid-Until "false";' > "$root/etc/apt/apt.conf.d/99sid-valid-until"
}

# Only the certificates the machine adds: the root's ca-certificates package,
# when install-deps installs it, puts them in the system bundle (its postinst
# runs update-ca-certificates, which reads /usr/local/share/ca-certificates).
copy_extra_cas() {
    local root=$1
    [ -d /usr/local/share/ca-certificates ] || return 0
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
}

give_registry_access() {
    local root=$1
    copy_apt_sources "$root"
    cp -a /etc/apt/apt.conf.d/. "$root/etc/apt/apt.conf.d/"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    copy_extra_cas "$root"
    [ ! -e /etc/pip.conf ] || cp /etc/pip.conf "$root/etc/pip.conf"
}

# Like this machine's image: package scripts do not start daemons.
forbid_service_starts() {
    local root=$1
    printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
}
