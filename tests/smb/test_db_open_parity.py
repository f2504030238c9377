"""The bridge gets the tdb parameters Samba's own db_open() would give tdb.

Native db_open() reads smb.conf before it opens a tdb: "tdb_hashsize:<db>"
when the caller passes hash size 0 (every release checked),
"tdb_hash_size:<db>" over the caller's (from Samba 4.22.1), and
"use mmap = no" (TDB_NOMMAP). The preload does the same for databases it
routes to the bridge. Here one smb.conf runs natively and then with the
volatile databases on bridge+tdb, and the tdb files must agree.
"""

from __future__ import annotations

import struct
from pathlib import Path

from dbwrap_py.paths import built_samba_release
from dbwrap_py.samba import VOLATILE_DATABASES, SambaSetup, ThrowawaySamba

#: Samba's callers pass 10007 for locking.tdb and brlock.tdb, and 0 for
#: smbXsrv_client_global.tdb (4.17 and 4.22 alike)
HASH_OPTIONS = {
    "tdb_hash_size:locking.tdb": "1231",  # read from 4.22.1 on
    "tdb_hashsize:smbXsrv_client_global.tdb": "997",  # read when the caller passes 0
    "tdb_hashsize:brlock.tdb": "499",  # so not here
}
#: a tdb header: magic[32], version, hash_size, ...
HASH_SIZE_OFFSET = 36


def hash_sizes(samba: ThrowawaySamba) -> dict[str, int]:
    sizes = {}
    for name in ("locking.tdb", "smbXsrv_client_global.tdb", "brlock.tdb"):
        with open(samba.root / "lock" / name, "rb") as f:
            sizes[name] = struct.unpack_from("<I", f.read(48), HASH_SIZE_OFFSET)[0]
    return sizes


def mapped_tdbs(pid: int) -> set[str]:
    """The tdb files a process has mmapped."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {Path(line.split()[-1]).name for line in maps.splitlines() if line.endswith(".tdb")}


def run(extra_global: dict[str, str], bridged: bool) -> tuple[dict[str, int], set[str]]:
    setup = SambaSetup(bridged=VOLATILE_DATABASES if bridged else (), extra_global=extra_global)
    with ThrowawaySamba(setup) as samba:
        return hash_sizes(samba), mapped_tdbs(samba.pid)


def test_hash_size_parameters_match_native():
    native, _ = run(HASH_OPTIONS, bridged=False)
    bridged, _ = run(HASH_OPTIONS, bridged=True)
    # what Samba itself makes of them, so the comparison proves something
    release = tuple(int(part) for part in built_samba_release().split("."))
    expected_locking = 1231 if release >= (4, 22, 1) else 10007
    assert native == {"locking.tdb": expected_locking, "smbXsrv_client_global.tdb": 997,
                      "brlock.tdb": 10007}
    assert bridged == native


def test_use_mmap_no_matches_native():
    _, native_mapped = run({}, bridged=False)
    _, bridged_mapped = run({}, bridged=True)
    # else the checks below prove nothing
    assert "locking.tdb" in native_mapped and "locking.tdb" in bridged_mapped
    _, native_unmapped = run({"use mmap": "no"}, bridged=False)
    _, bridged_unmapped = run({"use mmap": "no"}, bridged=True)
    assert not native_unmapped & set(VOLATILE_DATABASES)
    assert not bridged_unmapped & set(VOLATILE_DATABASES)
