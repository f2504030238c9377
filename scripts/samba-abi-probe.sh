#!/bin/bash
# What a Samba release's binaries say about the dbwrap layout that
# c_bridge/samba_abi.h declares: the byte offsets Samba's own accessors read.
# Run it before adding a release to the table in samba_abi.h, and compare
# with the offsets printed for a release already there.
#
#   scripts/samba-abi-probe.sh                  the installed Samba
#   scripts/samba-abi-probe.sh samba-libs.deb   a release's package, not installed
#
# Each accessor is a few instructions; the offset it reads is the field's:
#   dbwrap_get_seqnum   db_context.get_seqnum   (0x18 up to 4.24, 0x20 from 4.25:
#                                                traverse_per_rec_persistent_read)
#   dbwrap_wipe         db_context.wipe
#   dbwrap_name         db_context.name
#   dbwrap_is_persistent db_context.persistent
#   dbwrap_record_get_flags db_record.flags     (absent up to 4.24)
# And whether db_open_ex exists (4.25: db_open and g_lock reach databases
# through it, so the preload takes it over instead of db_open).
set -euo pipefail

need() { command -v "$1" >/dev/null || { echo "samba-abi-probe: needs $1 ($2)" >&2; exit 1; }; }
need objdump binutils
need nm binutils

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
if [ $# -ge 1 ]; then
    need dpkg-deb dpkg
    tmp=$(mktemp -d)
    for deb in "$@"; do dpkg-deb -x "$deb" "$tmp"; done
    libdir=$tmp/usr/lib/x86_64-linux-gnu
else
    libdir=/usr/lib/x86_64-linux-gnu
fi
dbwrap=""
for lib in "$libdir"/samba/libdbwrap-private-samba.so.0 "$libdir"/samba/libdbwrap-samba4.so.0; do
    [ -e "$lib" ] && { dbwrap=$lib; break; }
done
[ -n "$dbwrap" ] || { echo "samba-abi-probe: no libdbwrap in $libdir (samba-libs)" >&2; exit 1; }
dbwrap_syms=$(nm -D --defined-only "$dbwrap")
release=$(echo "$dbwrap_syms" | sed -n 's/.*@@SAMBA_\([0-9][0-9.]*[0-9]\).*/\1/p' | head -1)
echo "release ${release:-unknown} ($(basename "$dbwrap"))"

# The first memory operand's displacement off %rdi in an accessor's code.
offset_of() {
    local sym=$1 line
    if ! grep -q " $sym@" <<<"$dbwrap_syms"; then
        echo "  $sym: absent"; return
    fi
    line=$(objdump -d --no-show-raw-insn --disassemble="$sym" "$dbwrap" |
           grep -oE '[*]?0x[0-9a-f]+\(%rdi\)' | head -1)
    echo "  $sym: ${line:-no %rdi operand found}"
}
for sym in dbwrap_get_seqnum dbwrap_wipe dbwrap_name dbwrap_is_persistent dbwrap_record_get_flags; do
    offset_of "$sym"
done
smbconf=$libdir/libsmbconf.so.0
if [ -e "$smbconf" ]; then
    smbconf_syms=$(nm -D --defined-only "$smbconf")
    for sym in db_open db_open_ex; do
        if grep -q " $sym@" <<<"$smbconf_syms"; then echo "  $sym: exported"; else echo "  $sym: absent"; fi
    done
else
    echo "  libsmbconf.so.0 not here: db_open and db_open_ex not probed"
fi
