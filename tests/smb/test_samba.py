"""The installed smbd and Samba tools on the bridge, through the preload library.

Each test starts its own throwaway Samba on 127.0.0.1 and stops it by PID.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from dbwrap_py.samba import (
    PERSISTENT_DATABASES,
    TEST_USER,
    VOLATILE_DATABASES,
    SambaError,
    SambaSetup,
    ThrowawaySamba,
)
from dbwrap_py.servers import backend_options

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")


def smbclient(samba: ThrowawaySamba, command: str, share: str = "test") -> subprocess.CompletedProcess:
    return samba.run_tool(["smbclient", f"//127.0.0.1/{share}", "-U", samba.credentials,
                           "-p", str(samba.port), "-c", command], check=False)


def opened_through_bridge(samba: ThrowawaySamba) -> set[str]:
    """Databases the bridge opened, from its level-3 log lines."""
    text = samba.log.read_text(errors="replace")
    return {os.path.basename(m) for m in re.findall(r"dbwrap_py: db=(\S+) op=open: adapter", text)}


def test_volatile_databases_go_through_the_bridge_and_nothing_else():
    with ThrowawaySamba(SambaSetup(bridged=VOLATILE_DATABASES, log_level=3)) as samba:
        result = smbclient(samba, "put /etc/hostname probe; ls")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "probe" in result.stdout
        routed = opened_through_bridge(samba)
    assert set(VOLATILE_DATABASES) <= routed
    assert not routed & {"secrets.tdb", "passdb.tdb", "account_policy.tdb", "registry.tdb"}


@pytest.mark.parametrize("adapter", ["tdb", "cassandra"])
def test_persistent_databases_work_through_the_bridge(adapter):
    """smbd's start-up, pdbedit, net conf and sharesec on secrets, passdb,
    registry (transactions) and share_info; cassandra on a throwaway node."""
    if adapter == "cassandra":
        pytest.importorskip("cassandra")
    with backend_options(adapter, {}) as options:
        # smbd's start opens every database on the store before it listens:
        # on Cassandra, beside make test's torture matrix, that took over 30 s
        setup = SambaSetup(bridged=VOLATILE_DATABASES + PERSISTENT_DATABASES, log_level=3, adapter=adapter,
                           adapter_options=options, extra_global={"registry shares": "yes"},
                           start_timeout=90 if adapter == "cassandra" else 30)
        _persistent_databases_work(setup)


def _persistent_databases_work(setup: SambaSetup) -> None:
    with ThrowawaySamba(setup) as samba:
        conf = ["-s", str(samba.conf)]
        # passdb.tdb and secrets.tdb: the start-up's smbpasswd -a went through them
        users = samba.run_tool(["pdbedit", *conf, "-L"]).stdout
        assert TEST_USER in users
        # registry.tdb, with transactions: a registry share, served at once
        regshare = samba.root / "regshare"
        regshare.mkdir(mode=0o777)
        os.chmod(regshare, 0o777)
        samba.run_tool(["net", *conf, "conf", "addshare", "regshare", str(regshare), "writeable=y"])
        samba.run_tool(["net", *conf, "conf", "setparm", "regshare", "comment", "on the bridge"])
        listing = samba.run_tool(["net", *conf, "conf", "list"]).stdout
        assert "[regshare]" in listing and "on the bridge" in listing
        result = smbclient(samba, "put /etc/hostname via-registry; ls", share="regshare")
        assert result.returncode == 0 and "via-registry" in result.stdout, result.stdout + result.stderr
        # share_info.tdb: a share ACL
        samba.run_tool(["sharesec", *conf, "regshare", "-a", "S-1-1-0:ALLOWED/0/FULL"])
        assert "S-1-1-0" in samba.run_tool(["sharesec", *conf, "regshare", "-v"]).stdout
        routed = opened_through_bridge(samba)
        assert set(PERSISTENT_DATABASES) <= routed, routed
        passdb = samba.root / "private" / "passdb.tdb"
        dump = subprocess.run(["tdbdump", str(passdb)], capture_output=True, text=True).stdout
        if setup.adapter == "tdb":  # the tdb adapter writes real tdb files
            assert TEST_USER.upper() in dump.upper()
        else:  # the records are in the backend (an empty passdb.tdb appears: not by the bridge)
            assert TEST_USER.upper() not in dump.upper()


def test_adapter_exception_reaches_the_client_and_the_log(tmp_path):
    trigger = tmp_path / "fail-now"
    setup = SambaSetup(bridged=VOLATILE_DATABASES, adapter="dbwrap_py_fixtures.faulty_tdb",
                       adapter_options={"pythonpath": FIXTURES, "fail_when": str(trigger)})
    with ThrowawaySamba(setup) as samba:
        assert smbclient(samba, "put /etc/hostname before").returncode == 0
        trigger.touch()
        broken = smbclient(samba, "put /etc/hostname during")
        assert broken.returncode != 0
        assert "NT_STATUS_" in broken.stdout + broken.stderr
        log = samba.log.read_text(errors="replace")
        assert re.search(r"dbwrap_py: db=\S+ op=lock: RuntimeError: injected failure", log), log[-3000:]
        assert samba.running(), "smbd died"
        trigger.unlink()
        mended = smbclient(samba, "put /etc/hostname after; ls")
        assert mended.returncode == 0 and "after" in mended.stdout


@pytest.mark.parametrize(
    "adapter, options, message",
    [
        ("nosuchadapter", {}, "unknown adapter 'nosuchadapter'"),
        ("tdb", {"bogus": "1"}, "unknown option(s) bogus"),
        ("dbwrap_py_fixtures.import_error", {"pythonpath": FIXTURES}, "failed to import"),
    ],
)
def test_misconfiguration_stops_smbd_with_a_clear_log_line(adapter, options, message):
    samba = ThrowawaySamba(SambaSetup(bridged=VOLATILE_DATABASES, adapter=adapter,
                                      adapter_options=options, start_timeout=20), keep=True)
    try:
        with pytest.raises(SambaError):
            samba.start()
        log = samba.log.read_text(errors="replace")
        assert message in log
        # never a silent fallback: the routed database was not created as tdb
        assert not (samba.root / "lock" / "locking.tdb").exists()
    finally:
        samba.keep = False
        samba.stop()


def test_stop_leaves_no_smbd():
    with ThrowawaySamba(SambaSetup(bridged=VOLATILE_DATABASES)) as samba:
        assert smbclient(samba, "ls").returncode == 0  # a forked child per client
        pgid = samba.pid
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # signal 0: does the group still exist?


def test_per_database_adapter_and_options():
    setup = SambaSetup(bridged=VOLATILE_DATABASES, log_level=3,
                       adapter_options={"brlock.tdb:module": "sqlite", "brlock.tdb:timeout": "5"})
    with ThrowawaySamba(setup) as samba:
        put = smbclient(samba, "put /etc/hostname x; ls")
        assert put.returncode == 0, f"{put.stdout}{put.stderr}\n{samba.log_tail(80)}"
        log = samba.log.read_text(errors="replace")
    assert re.search(r"db=\S+/brlock\.tdb op=open: adapter sqlite", log)
    assert re.search(r"db=\S+/locking\.tdb op=open: adapter tdb", log)


def test_a_share_smbd_cannot_serve_is_explained_by_smbd_log_lines():
    from dbwrap_py.smbtorture import path_contention

    setup = SambaSetup(bridged=VOLATILE_DATABASES, share_vfs_objects="acl_xattr no_such_vfs_module")
    with ThrowawaySamba(setup) as samba:
        rates = path_contention(samba, 1, 1)
    assert not rates.ok and rates.opens_per_second == 0
    assert re.match(r"smbd: Error loading module '\S+/no_such_vfs_module\.so'", rates.cause[0]), rates.cause
    assert any("NT_STATUS_BAD_NETWORK_NAME" in line for line in rates.cause), rates.cause


def test_a_torture_run_whose_smbd_cannot_start_fails_with_smbd_log_lines():
    from dbwrap_py.smbtorture import run_suite

    # the bridge refuses an option no adapter reads, so smbd cannot open its databases
    setup = SambaSetup(bridged=VOLATILE_DATABASES, adapter_options={"no_such_option": "1"},
                       start_timeout=10)
    run = run_suite("smb2.create.open", setup, "bridge")
    assert run.returncode == -2 and not run.results
    assert run.cause[0] == "smbd did not start for smb2.create.open:", run.cause
    assert any("no_such_option" in line for line in run.cause), run.cause


def test_the_own_files_workload_opens_a_file_per_client_on_the_real_smbd(tmp_path):
    from dbwrap_py.smbtorture import OWN_FILES_PREFIX, own_files

    with ThrowawaySamba(SambaSetup(bridged=VOLATILE_DATABASES)) as samba:
        rates = own_files([samba], tmp_path, 3, 2)
        made = sorted(p.name for p in samba.share_path.glob(OWN_FILES_PREFIX + "*"))
    assert rates.ok and rates.opens_per_second > 0, rates.cause
    assert made == [f"{OWN_FILES_PREFIX}{i:03d}" for i in range(3)]
