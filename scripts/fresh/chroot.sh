# test-fresh: entering the root and leaving nothing behind. The chroot shares
# the host's PID and network namespaces, so its processes are found by their
# root directory and stopped by PID, never by name.
# Sourced by scripts/test-fresh.sh.

# The device nodes programs expect; debootstrap makes them, this checks.
check_dev() {
    local root=$1 node missing=""
    for node in null zero full random urandom tty ptmx; do
        [ -c "$root/dev/$node" ] || missing="$missing /dev/$node"
    done
    [ -z "$missing" ] || { echo "test-fresh: the root lacks$missing" >&2; return 1; }
}

# The root bound onto itself first: on a machine / is a mount point, and
# Java's FileStore (Cassandra checks its disk space at start) looks for the
# mount of a path in /proc/self/mounts, which shows a plain directory's
# chroot no mount to match. Then proc (ps, /proc/self), sysfs read-only,
# the host's ptys (apt's log, openpty) and a /dev/shm every user may write
# (multiprocessing's semaphores).
mount_root() {
    local root=$1
    check_dev "$root"
    mount --bind "$root" "$root"
    mkdir -p "$root/dev/pts" "$root/dev/shm"
    mount -t proc proc "$root/proc"
    mount -t sysfs -o ro sysfs "$root/sys"
    mount --bind /dev/pts "$root/dev/pts"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
}

# A command in the root as a fresh machine's root user has it: nothing of
# the host's environment (PIP_*, PYTHON*, SSL_*, ...) comes along.
in_root() {
    local root=$1; shift
    chroot "$root" /usr/bin/env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 TERM=dumb "$@"
}

# PIDs of the processes whose root directory is the root or below it.
root_pids() {
    local root=$1 dir link
    for dir in /proc/[0-9]*; do
        link=$(readlink "$dir/root" 2>/dev/null) || continue
        case $link in "$root" | "$root"/*) echo "${dir#/proc/}" ;; esac
    done
}

# TERM, up to 10 s to exit, then KILL: what the tests left running (a
# samba-dcerpcd outlives its smbd for a while, for one).
stop_root_processes() {
    local root=$1 pids tries=0
    pids=$(root_pids "$root")
    [ -n "$pids" ] || return 0
    echo "test-fresh: stopping processes left in the root:" $pids
    kill -TERM $pids 2>/dev/null || true
    while [ -n "$(root_pids "$root")" ] && [ $tries -lt 20 ]; do
        sleep 0.5; tries=$((tries + 1))
    done
    pids=$(root_pids "$root")
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

# Mount points at or below the root, deepest first (ours, and any a test made).
root_mounts() {
    local root=$1
    awk -v root="$root" '$5 == root || index($5, root "/") == 1 { print $5 }' \
        /proc/self/mountinfo | sort -r
}

unmount_root() {
    local root=$1 point
    for point in $(root_mounts "$root"); do
        umount "$point" 2>/dev/null || umount -l "$point"
    done
}

# Only once nothing is mounted below it: rm must never reach the host's /dev.
remove_root() {
    local root=$1
    if [ -n "$(root_mounts "$root")" ]; then
        echo "test-fresh: still mounted under $root, not removing it" >&2
        return 1
    fi
    rm -rf --one-file-system "$root"
}
