"""Failures explain themselves: the cause is found in smbd's log and smbtorture's output."""

import argparse

from dbwrap_py import cli
from dbwrap_py.bench import smb
from dbwrap_py.explain import explain, smbd_problems, torture_problems

# smbd 4.17's log when a share's VFS module is missing (samba-vfs-modules not installed)
SMBD_LOG = """\
[2026/11/23 04:32:53.929310,  0] ../../source3/smbd/server.c:1741(main)
  smbd version 4.17.12-Debian started.
  Copyright Andrew Tridgell and the Samba Team 1992-2022
[2026/11/23 04:32:53.931325,  1] ../../source3/profile/profile.c:53(set_profile_level)
  INFO: Profiling turned OFF from pid 5585
[2026/11/23 04:32:54.059115,  0] ../../lib/util/modules.c:49(load_module)
  Error loading module '/usr/lib/x86_64-linux-gnu/samba/vfs/streams_xattr.so': cannot open shared object file: No such file or directory
[2026/11/23 04:32:54.059166,  0] ../../source3/smbd/vfs.c:185(vfs_init_custom)
  error probing vfs module 'streams_xattr': NT_STATUS_UNSUCCESSFUL
[2026/11/23 04:32:54.061000,  3] ../../source3/smbd/open.c:10(x)
  dbwrap_py: db=/tmp/x/locking.tdb op=lock: Timeout: etcd did not answer in 2s (NTSTATUS 0xc00000b5)
"""

TORTURE_OUTPUT = """\
smbtorture 4.17.12-Debian
Using seed 1795408374
time: 2026-11-23 04:32:54.048561
test: path-contention-shared
failure: path-contention-shared [
../../source4/torture/smb2/smb2.c:37: Establishing SMB2 connection failed
]
Failed to connect to SMB2 share \\\\127.0.0.1\\test - NT_STATUS_BAD_NETWORK_NAME
"""


def test_smbd_problems_are_level_0_messages_and_bridge_lines_without_the_banner():
    problems = smbd_problems(SMBD_LOG)
    assert problems[0].startswith("Error loading module '") and "streams_xattr.so" in problems[0]
    assert "error probing vfs module 'streams_xattr'" in problems[1]
    assert problems[2].startswith("dbwrap_py: db=/tmp/x/locking.tdb op=lock: Timeout")
    assert not any("smbd version" in p or "Profiling" in p for p in problems)


def test_torture_problems_name_the_failure_and_the_status():
    lines = torture_problems(TORTURE_OUTPUT)
    assert "failure: path-contention-shared [" in lines
    assert any("NT_STATUS_BAD_NETWORK_NAME" in line for line in lines)
    assert not any(line.startswith(("time:", "Using seed")) for line in lines)


def test_explain_puts_smbd_first_and_is_never_empty():
    lines = explain(TORTURE_OUTPUT, SMBD_LOG)
    assert lines[0].startswith("smbd: Error loading module")
    assert any(line.startswith("smbtorture: ") for line in lines)
    assert explain("", "") == ["smbtorture printed nothing and smbd logged no error"]
    assert explain("connecting\nsomething odd\n", "") == \
        ["smbtorture: connecting", "smbtorture: something odd"]


def test_a_failed_demo_exits_non_zero_with_the_cause_on_the_last_line(monkeypatch, capsys):
    cause = "smbd: Error loading module 'streams_xattr.so': cannot open shared object file"

    def failed_run(nprocs, seconds, adapter="tdb"):
        return [smb.Point("native", 4, 0.0, 0.0, 0.0, 0.0, False, error=cause),
                smb.Point(f"bridge+{adapter}", 4, 0.0, 0.0, 0.0, 0.0, False, error=cause)]

    monkeypatch.setattr(smb, "run", failed_run)
    status = cli._cmd_demo(argparse.Namespace(adapter="tdb", nprocs=4, time=1))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert status == 1
    assert last.startswith("demo failed: native measured 0 opens/s: ") and cause in last
