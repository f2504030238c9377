#!/bin/sh
# make test-memcheck: the C suite, the check that do_locked's value stays
# valid while its callback writes, and the node cache's fast path, under
# valgrind memcheck. Any error memcheck reports (an invalid read among them)
# fails the run and is printed.
#
# PYTHONMALLOC=malloc: CPython's own allocator reads memory memcheck cannot
# follow (Python's README.valgrind); with malloc, every report is real.
set -eu
cd "$(dirname "$0")/.."
logs=$(mktemp -d /tmp/dbwrap_py_memcheck.XXXXXX)
trap 'rm -rf "$logs"' EXIT

memcheck() {
    PYTHONMALLOC=malloc valgrind --tool=memcheck --trace-children=yes --leak-check=no --vgdb=no \
        -q --log-file="$logs/%p.log" "$@"
}

failed=""
# every run, even after a failure, so the report below covers them all
run() {
    "$@" || failed="$failed${failed:+, }$*"
}

# the driver prints each check's result as JSON; a failed check is a failure here
check() {
    out=$(memcheck build/dbwrap_check "$@" --only lock.handed-value)
    echo "$out"
    echo "$out" | grep -q '"result": "pass"'
}

# the node cache's fast path in C, through the bridge: etcd and its node agent
# run outside valgrind (the conformance runner starts them), the driver inside.
# op_timeout 60 s and etcd's default 10 s lease: Python under valgrind runs
# some 30 times slower, and beside make test's torture matrix an open failed
# with EIO and lock checks ran past the check's 120 s (stop 50, with a 2 s
# lease). -v keeps the bridge's and the agent's log lines; they are printed
# only when a check failed, so a failure names its cause.
cached() {
    PYTHONMALLOC=malloc DBWRAP_PY_CHECK_PREFIX="valgrind --tool=memcheck --trace-children=yes \
        --leak-check=no --vgdb=no -q --log-file=$logs/%p.log" \
        .venv/bin/python -m dbwrap_py.cli check etcd -v -o op_timeout=60 -o node_cache=yes \
        --only lock.handed-value --only lock.counter --only lock.own-writes --only kv.missing \
        >"$logs/cached.out" || true
    if grep -q "4 passed, 0 failed" "$logs/cached.out"; then
        sed '/^bridge log:$/,$d' "$logs/cached.out"
    else
        cat "$logs/cached.out"
        return 1
    fi
}

# the bridge+proxy column's node daemon runs outside valgrind
DBWRAP_PY_PATH="$PWD/tests/fixtures" run .venv/bin/python -m dbwrap_py.proxy.around -- \
    env PYTHONMALLOC=malloc valgrind --tool=memcheck --trace-children=yes --leak-check=no --vgdb=no \
    -q --log-file="$logs/%p.log" build/test_dbwrap
# Python 3.14 (Debian sid) checks its C stack against the bounds the system
# reports. Under valgrind every conformance driver's check process stopped
# with "Fatal Python error: _Py_CheckRecursiveCall: Unrecoverable stack
# overflow (used 5 kB)" (measured with 3.14.10, with and without
# --main-stacksize), while the C suite above passed; the cause is not found.
# So on 3.14 only the C suite runs under memcheck; Debian 12 and 13 (the
# same C code) run all of it.
if .venv/bin/python -c 'import sys; sys.exit(sys.version_info >= (3, 14))'; then
    run check --native
    run check --adapter tdb
    run check --adapter tdb --option native_records=no
    run cached
else
    echo "memcheck: the conformance driver's runs left out on Python 3.14 (see scripts/memcheck.sh)"
fi

processes=$(ls "$logs"/*.log | wc -l)
errors=$(cat "$logs"/*.log | grep -c '^==[0-9]*== [A-Z]' || true)
invalid=$(cat "$logs"/*.log | grep -c '^==[0-9]*== Invalid \(read\|write\)' || true)
if [ "$errors" -ne 0 ]; then
    cat "$logs"/*.log
fi
echo "memcheck: $processes processes, $errors errors, $invalid invalid reads or writes" \
     "${failed:+; failed: $failed}"
[ "$errors" -eq 0 ] && [ -z "$failed" ]
