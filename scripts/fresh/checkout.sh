# test-fresh: the project inside the root, as CI has it: a clean clone of the
# checkout at ~/work/main (the committed HEAD only: uncommitted changes are
# not tested) and the checkout's ../shared beside it at ~/work/shared.
# Sourced by scripts/test-fresh.sh.

copy_checkout() {
    local checkout=$1 root=$2 head
    head=$(git -C "$checkout" rev-parse HEAD)
    if [ -n "$(git -C "$checkout" status --porcelain --untracked-files=no)" ]; then
        echo "test-fresh: note: uncommitted changes in $checkout are not tested"
    fi
    mkdir -p "$root/root/work"
    # --no-hardlinks: the root shares nothing with the checkout
    git clone -q --no-hardlinks "$checkout" "$root/root/work/main"
    git -C "$root/root/work/main" -c advice.detachedHead=false checkout -q "$head"
    echo "test-fresh: testing $(git -C "$checkout" log -1 --format='%h %s' "$head")"
    if [ -d "$checkout/../shared" ]; then
        cp -a "$checkout/../shared" "$root/root/work/shared"
    else
        echo "test-fresh: note: no ../shared beside the checkout"
    fi
}
