# test-fresh: the project inside the root, as CI has it: a clean clone of the
# checkout at ~/work/main and the checkout's ../shared beside it at
# ~/work/shared. The clone is the committed HEAD: uncommitted changes are not
# tested, unless FRESH_UNCOMMITTED=1 applies those to tracked files (for
# trying a change before committing it).
# Sourced by scripts/test-fresh.sh.

# The uncommitted changes to tracked files, applied to the clone or named.
carry_uncommitted() {
    local checkout=$1 clone=$2
    [ -n "$(git -C "$checkout" status --porcelain --untracked-files=no)" ] || return 0
    if [ "${FRESH_UNCOMMITTED:-0}" != 1 ]; then
        echo "test-fresh: note: uncommitted changes are not tested (FRESH_UNCOMMITTED=1 would)"
        return 0
    fi
    echo "test-fresh: with the uncommitted changes to:" $(git -C "$checkout" diff HEAD --name-only)
    git -C "$checkout" diff HEAD --binary | git -C "$clone" apply
}

copy_checkout() {
    local checkout=$1 root=$2 head clone=$2/root/work/main
    head=$(git -C "$checkout" rev-parse HEAD)
    mkdir -p "$root/root/work"
    # --no-hardlinks: the root shares nothing with the checkout
    git clone -q --no-hardlinks "$checkout" "$clone"
    git -C "$clone" -c advice.detachedHead=false checkout -q "$head"
    # for the summary (this runs in a subshell): HEAD may move meanwhile
    git -C "$checkout" rev-parse --short "$head" >"$results/tested-head"
    echo "test-fresh: testing $(git -C "$checkout" log -1 --format='%h %s' "$head")"
    carry_uncommitted "$checkout" "$clone"
    if [ -d "$checkout/../shared" ]; then
        cp -a "$checkout/../shared" "$root/root/work/shared"
    else
        echo "test-fresh: note: no ../shared beside the checkout"
    fi
}

# FRESH_DEB: the package and its test, nothing else of the checkout.
copy_package() {
    local checkout=$1 deb=$2 root=$3
    mkdir -p "$root/root/package"
    cp "$deb" "$checkout"/tests/package/* "$root/root/package/"
    basename "$deb" >"$results/tested-head"
    echo "test-fresh: testing the package $(basename "$deb")"
}
