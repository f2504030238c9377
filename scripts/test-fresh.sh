#!/bin/bash
# make test-fresh: the README's two commands on a fresh Debian machine.
#
# A bare Debian root (debootstrap minbase plus make, cached) gets this
# machine's registry access and a clean clone of the checkout; then, in a
# chroot with an empty environment, the make targets run as a user would
# type them. The clone takes the committed HEAD: uncommitted changes are not
# tested. Needs root (debootstrap, mount, chroot).
#
#   FRESH_SUITE=trixie   a Debian 13 root (make test-trixie); bookworm by default;
#                        sid: Debian unstable, Samba 4.25 (make test-sid)
#   FRESH_TARGETS="..."  the make targets, in order; "demo test-setup" by default;
#                        a word VAR=value is given to make for every target after it
#   FRESH_CACHE=0        a cold run: build the root again and replace the cache
#   FRESH_PREPARED=1     start from the root as `make deps` left it, cached per
#                        package list (the first run makes it): CI's Debian 13
#                        and sid steps, which prove the platform, not the set-up
#   FRESH_UNCOMMITTED=1  apply the uncommitted changes to tracked files too
#   FRESH_DEB=FILE       no checkout: the root gets the .deb and tests/package/
#                        only, and one step, "installed", runs
#                        tests/package/run.sh there (make test-deb)
#   KEEP=1               keep the root afterwards (stopped and unmounted)
#
# Logs: results/fresh/<step>.log and results/fresh/summary.txt (another
# suite's: results/fresh-<suite>/).
set -euo pipefail

scripts=$(cd "$(dirname "$0")" && pwd)
checkout=$(dirname "$scripts")
suite=${FRESH_SUITE:-bookworm}
results=$checkout/results/fresh
[ "$suite" = bookworm ] || results=$results-$suite
[ -z "${FRESH_DEB:-}" ] || results=$results-deb
targets=${FRESH_TARGETS:-demo test-setup}
. "$scripts/fresh/host-tools.sh"
. "$scripts/fresh/root.sh"
. "$scripts/fresh/registry-access.sh"
. "$scripts/fresh/checkout.sh"
. "$scripts/fresh/chroot.sh"

workdir="" root="" current_step="" mode=""
step_names=() step_secs=()
run_start=$EPOCHREALTIME

seconds_since() {
    awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

# One step: timed, its output on the terminal and in results/fresh/<step>.log.
# It runs with errexit in a subshell of a plain pipeline (not under `if` or
# `||`, where bash would silently turn errexit off inside it).
run_step() {
    local name=$1 start rc
    shift
    echo "==> test-fresh: $name"
    current_step=$name
    start=$EPOCHREALTIME
    set +e
    ( set -e; "$@" ) 2>&1 | tee "$results/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    step_names+=("$name") step_secs+=("$(seconds_since "$start")")
    [ "$rc" -eq 0 ] || fail_step "$name" "$rc"
    current_step=""
}

# Never a bare "failed": the step, its status and the end of its output.
fail_step() {
    echo
    echo "test-fresh: step '$1' failed (exit $2); the last 60 lines of $results/$1.log:"
    tail -n 60 "$results/$1.log" | sed 's/^/  | /'
    exit "$2"
}

# Everything the host gives the root before the project's commands run.
prepare_root() {
    give_registry_access "$root"
    forbid_service_starts "$root"
    if [ -n "${FRESH_DEB:-}" ]; then
        copy_package "$checkout" "$FRESH_DEB" "$root"
    else
        copy_checkout "$checkout" "$root"
    fi
    mount_root "$root"
}

# Stop, unmount, remove; a second Ctrl-C must not interrupt this.
leave_root() {
    trap '' INT TERM HUP
    stop_root_processes "$root"
    unmount_root "$root"
    if [ "${KEEP:-0}" = 1 ]; then
        echo "test-fresh: kept the root (unmounted): $root"
        return 0
    fi
    remove_root "$root" && rmdir "$workdir"
}

print_summary() {
    local rc=$1 i status=passed
    [ "$rc" -eq 0 ] || status="FAILED${current_step:+ in $current_step} (exit $rc)"
    {
        echo "test-fresh: $status, $mode $suite root, HEAD $(cat "$results/tested-head" 2>/dev/null || echo "not cloned")"
        for i in "${!step_names[@]}"; do
            printf '  %-10s %7s s\n' "${step_names[$i]}" "${step_secs[$i]}"
        done
        printf '  %-10s %7s s\n' total "$(seconds_since "$run_start")"
    } | tee "$results/summary.txt"
}

on_exit() {
    local rc=$?
    trap - EXIT
    if [ -n "$root" ]; then
        leave_root || rc=1
    fi
    print_summary "$rc"
    exit "$rc"
}

main() {
    [ "$(id -u)" -eq 0 ] || { echo "test-fresh: needs root (mount, chroot)" >&2; exit 1; }
    mkdir -p "$results"
    rm -f "$results"/*.log "$results/summary.txt" "$results/tested-head"
    if prepared_wanted && prepared_fresh; then
        mode=prepared
    elif [ "${FRESH_CACHE:-1}" != 0 ] && [ -s "$fresh_cache" ]; then
        mode=cached
    else
        mode=cold
    fi
    need_host_commands zstd:zstd
    trap on_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM HUP
    # resolved, since processes in the root are found by /proc/PID/root
    workdir=$(realpath "$(mktemp -d "/var/tmp/dbwrap-fresh-$suite.XXXXXX")")
    root=$workdir/root
    mkdir -m 755 "$root"
    run_step root create_root "$root"
    run_step prepare prepare_root
    if [ -n "${FRESH_DEB:-}" ]; then
        run_step installed in_root "$root" sh /root/package/run.sh
        return 0
    fi
    if prepared_wanted && [ "$mode" != prepared ]; then
        run_step deps in_root "$root" sh -c "cd ~/work/main && exec make deps"
        run_step cache save_prepared "$root"
    fi
    local target assignments=""
    for target in $targets; do
        case $target in
        *=*) assignments="$assignments $target" ;;
        *) run_step "$target" in_root "$root" sh -c "cd ~/work/main && exec make$assignments $target" ;;
        esac
    done
}

main "$@"
