#!/bin/bash
# make deb: the Debian package, build/deb/dbwrap-py_VERSION_ARCH.deb.
#
# dpkg-buildpackage runs on a copy of the checkout's files (those git
# tracks, and new ones it does not ignore) with packaging/debian as its
# debian/, in build/deb/, so the build never touches the checkout's build/,
# .venv or parent directory. The package is built for the Samba release
# installed here and depends on exactly that one (scripts/package-depends.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
out=build/deb
tree=$out/dbwrap-py-$version

rm -rf "$out"
mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard |
    (while IFS= read -r -d '' f 2>/dev/null; do [ -e "$f" ] && printf '%s\0' "$f"; done) |
    tar -c --null -T - -f - | tar -x -C "$tree" -f -
cp -a packaging/debian "$tree/debian"

echo "make deb: dpkg-buildpackage in $tree (log: $out/build.log)"
if ! (cd "$tree" && dpkg-buildpackage -b -us -uc) > "$out/build.log" 2>&1; then
    echo "make deb: dpkg-buildpackage failed; the last 40 lines of $out/build.log:" >&2
    tail -n 40 "$out/build.log" | sed 's/^/  | /' >&2
    exit 1
fi
ls "$out"/dbwrap-py_*.deb
