"""Swapping a Samba's backend keeps its persistent data: the procedure in
docs/operating.md.

One Samba folder is served in turn by native tdb, by sqlite, by etcd and by
native tdb again. Between two runs smbd is stopped, ``dbwrap-py copy`` moves
the persistent databases, and the old files are moved aside (kept as the
backup), so each run can only serve what the copy carried: the machine
SID (secrets), the user's password (passdb), a registry share with its
comment (net conf), its share ACL (sharesec), an account policy and a group
mapping. smbd itself never adds the user again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dbwrap_py.samba import PERSISTENT_DATABASES, TEST_USER, SambaSetup, ThrowawaySamba
from dbwrap_py.testing.servers.etcd import EtcdCluster

REGISTRY_SHARE = "regshare"
COMMENT = "carried across backends"
ACE = "S-1-1-0:ALLOWED/0/FULL"
MAX_PASSWORD_AGE = "4242"


def dbwrap_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dbwrap_py.cli", *args],
                          capture_output=True, text=True, timeout=300)


def serve(root: Path, adapter: str | None, options: dict[str, str] | None = None,
          first: bool = False) -> ThrowawaySamba:
    """The same Samba folder, its persistent databases on ``adapter`` (None: native tdb)."""
    setup = SambaSetup(bridged=PERSISTENT_DATABASES if adapter else (), adapter=adapter or "tdb",
                       adapter_options=options or {}, add_user=first,
                       extra_global={"registry shares": "yes"})
    return ThrowawaySamba(setup, keep=True, root=root)


def machine_sid(samba: ThrowawaySamba) -> str:
    """From secrets.tdb; without it Samba would make up a new one, and logins still work."""
    out = samba.run_tool(["net", "-s", str(samba.conf), "getlocalsid"]).stdout
    return out.strip().rsplit(" ", 1)[-1]


def write_samba_data(samba: ThrowawaySamba) -> str:
    """Data in every persistent database; returns the machine SID."""
    conf = ["-s", str(samba.conf)]
    share = samba.root / REGISTRY_SHARE
    share.mkdir(mode=0o777, exist_ok=True)
    os.chmod(share, 0o777)
    samba.run_tool(["net", *conf, "conf", "addshare", REGISTRY_SHARE, str(share), "writeable=y"])
    samba.run_tool(["net", *conf, "conf", "setparm", REGISTRY_SHARE, "comment", COMMENT])
    samba.run_tool(["sharesec", *conf, REGISTRY_SHARE, "-a", ACE])
    samba.run_tool(["pdbedit", *conf, "-P", "maximum password age", "-C", MAX_PASSWORD_AGE])
    samba.run_tool(["net", *conf, "groupmap", "add", "ntgroup=dbwrappy-admins", "unixgroup=root",
                    "rid=1234", "type=domain"])
    return machine_sid(samba)


def assert_samba_data(samba: ThrowawaySamba, where: str, sid: str) -> None:
    conf = ["-s", str(samba.conf)]
    assert machine_sid(samba) == sid, f"{where}: secrets.tdb's machine SID was not carried"
    login = samba.run_tool(["smbclient", f"//127.0.0.1/{REGISTRY_SHARE}", "-U", samba.credentials,
                            "-p", str(samba.port), "-c", f"put /etc/hostname from-{where}; ls"],
                           check=False)
    assert login.returncode == 0 and f"from-{where}" in login.stdout, \
        f"{where}: the user cannot use the registry share:\n{login.stdout}{login.stderr}\n" \
        + samba.log_tail()
    assert COMMENT in samba.run_tool(["net", *conf, "conf", "showshare", REGISTRY_SHARE]).stdout
    assert "S-1-1-0" in samba.run_tool(["sharesec", *conf, REGISTRY_SHARE, "-v"]).stdout
    policy = samba.run_tool(["pdbedit", *conf, "-P", "maximum password age"]).stdout
    assert f"value is: {MAX_PASSWORD_AGE}" in policy, policy
    assert "dbwrappy-admins" in samba.run_tool(["net", *conf, "groupmap", "list"]).stdout
    assert TEST_USER in samba.run_tool(["pdbedit", *conf, "-L"]).stdout


def copy(samba: ThrowawaySamba, source: list[str], destination: list[str]) -> str:
    result = dbwrap_py("copy", "--from", *source, "--to", *destination,
                       "--persistent", "--configfile", str(samba.conf))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def move_aside(samba: ThrowawaySamba, old_adapter: str) -> None:
    """Keep the old backend's files as the backup, out of the new backend's way."""
    suffix = {"tdb": "", "sqlite": ".sqlite"}[old_adapter]
    for folder in ("private", "state"):
        for path in (samba.root / folder).iterdir():
            db = path.name.split(".tdb")[0] + ".tdb"
            if db in PERSISTENT_DATABASES and path.name.startswith(db + suffix) \
                    and path.name[len(db + suffix):] in ("", "-wal", "-shm", ".locks"):
                path.rename(path.with_name(f"{path.name}.bak-{old_adapter}"))


@pytest.fixture
def etcd():
    with EtcdCluster() as cluster:
        yield cluster


def test_tdb_to_sqlite_to_etcd_to_tdb_keeps_users_shares_and_acls(etcd):
    native = serve(None, None, first=True)  # a new folder; later runs reuse it
    root = native.root
    etcd_options = {"endpoints": etcd.endpoints}
    try:
        with native as samba:
            sid = write_samba_data(samba)
            assert sid.startswith("S-1-5-21-"), sid
            assert_samba_data(samba, "tdb", sid)
            refused = dbwrap_py("copy", "--from", "tdb", "--to", "sqlite", "--persistent",
                                "--configfile", str(samba.conf))
            assert refused.returncode == 2
            assert f"smbd (pid {samba.pid}" in refused.stderr, refused.stderr

        out = copy(native, ["tdb"], ["sqlite"])
        assert "secrets.tdb: " in out and "passdb.tdb: " in out and " verified" in out
        move_aside(native, "tdb")
        with serve(root, "sqlite") as samba:
            assert_samba_data(samba, "sqlite", sid)

        copy(native, ["sqlite"], ["etcd", "-o", f"endpoints={etcd.endpoints}"])
        move_aside(native, "sqlite")
        with serve(root, "etcd", etcd_options) as samba:
            assert_samba_data(samba, "etcd", sid)

        copy(native, ["etcd", "-o", f"endpoints={etcd.endpoints}"], ["tdb"])
        with serve(root, None) as samba:
            assert_samba_data(samba, "tdb-again", sid)

        again = dbwrap_py("copy", "--from", "etcd", "-o", f"endpoints={etcd.endpoints}",
                          "--to", "tdb", "--persistent", "--configfile", str(native.conf))
        assert again.returncode == 2
        assert "the destination already holds" in again.stdout
        assert "pass --overwrite to replace them" in again.stdout
    finally:
        native.keep = False
        native.stop()


def test_persistent_databases_on_rados_serve_smbd_and_copy_back_to_tdb():
    """secrets, passdb, registry, share_info, account_policy and group_mapping
    on a throwaway Ceph from the first run: the tools write them through the
    bridge, a second smbd on the same folder serves them, and ``dbwrap-py
    copy`` brings them back to native tdb."""
    from dbwrap_py.testing.servers.rados import CephCluster

    with CephCluster(osds=1) as ceph:
        options = ceph.options()
        first = serve(None, "rados", options, first=True)
        root = first.root
        try:
            with first as samba:
                sid = write_samba_data(samba)
                assert_samba_data(samba, "rados", sid)
            assert not list((root / "private").glob("secrets.tdb*")), "secrets reached a file"
            with serve(root, "rados", options) as samba:
                assert_samba_data(samba, "rados-again", sid)
            copy(first, ["rados", *[f"-o{k}={v}" for k, v in options.items()]], ["tdb"])
            with serve(root, None) as samba:
                assert_samba_data(samba, "tdb-from-rados", sid)
        finally:
            first.keep = False
            first.stop()
