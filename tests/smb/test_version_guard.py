"""The preload serves only the Samba release it was built for.

A preload built claiming another release (``make preload-claiming``, into a
temporary folder; build/ is left alone) is LD_PRELOADed into the installed
smbd. It must log one line naming both releases; a database routed to the
bridge must then fail to open, so smbd stops with its own error (no crash),
and with nothing routed smbd serves natively. The matching build logs no
such line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from dbwrap_py.paths import REPO_ROOT, built_samba_release
from dbwrap_py.samba import VOLATILE_DATABASES, SambaError, SambaSetup, ThrowawaySamba

LOAD_LINE = re.compile(r"dbwrap_py: db=- op=load: built for Samba (\S+), running Samba (\S+):")


def other_release(release: str) -> str:
    return "4.22.11" if release != "4.22.11" else "4.17.12"


@pytest.fixture
def claimed_preload(tmp_path: Path) -> tuple[Path, str]:
    """A preload built for a release that is not the installed one."""
    claimed = other_release(built_samba_release())
    library = tmp_path / "claimed" / "libdbwrap_py_preload.so"
    library.parent.mkdir()
    built = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO_ROOT),
                            "preload-claiming", f"CLAIMED_SAMBA_VERSION={claimed}",
                            f"CLAIMED_PRELOAD={library}"],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    return library, claimed


def load_lines(log: str) -> list[tuple[str, str]]:
    return LOAD_LINE.findall(log)


def test_routed_databases_refuse_and_smbd_exits_cleanly(claimed_preload, tmp_path):
    library, claimed = claimed_preload
    samba = ThrowawaySamba(SambaSetup(bridged=VOLATILE_DATABASES, preload=library),
                           keep=True, root=tmp_path / "samba")
    with pytest.raises(SambaError) as refused:
        with samba:
            pass
    log = samba.log.read_text(errors="replace")
    exited = re.search(r"smbd exited with (-?\d+)", str(refused.value))
    assert exited and int(exited.group(1)) > 0, f"smbd did not exit by itself:\n{refused.value}"
    assert "PANIC" not in log, log
    lines = load_lines(log)
    assert len(lines) == 1, f"want one load line:\n{log}"
    built_for, running = lines[0]
    assert built_for == claimed and running.startswith(built_samba_release()), lines
    refusal = re.search(r"dbwrap_py: db=\S+/(\S+\.tdb) op=open: not opened: the bridge is off", log)
    assert refusal and refusal.group(1) in VOLATILE_DATABASES, log


def test_nothing_routed_smbd_serves_natively_and_logs_once(claimed_preload):
    library, claimed = claimed_preload
    with ThrowawaySamba(SambaSetup(preload=library)) as samba:
        result = samba.run_tool(["smbclient", samba.unc, "-U", samba.credentials, "-p",
                                 str(samba.port), "-c", "put /etc/hostname probe; ls"], check=False)
        assert result.returncode == 0 and "probe" in result.stdout, \
            result.stdout + result.stderr + samba.log_tail()
        log = samba.log.read_text(errors="replace")
    # smbd's parent decides; the client's forked smbd inherits it and logs nothing more
    lines = load_lines(log)
    assert len(lines) == 1 and lines[0][0] == claimed, f"want one load line:\n{log}"
    assert "op=open" not in log, log


def test_matching_build_logs_no_load_line_and_routes():
    with ThrowawaySamba(SambaSetup(bridged=("locking.tdb",), log_level=3)) as samba:
        result = samba.run_tool(["smbclient", samba.unc, "-U", samba.credentials, "-p",
                                 str(samba.port), "-c", "ls"], check=False)
        assert result.returncode == 0, result.stdout + result.stderr + samba.log_tail()
        log = samba.log.read_text(errors="replace")
    assert "op=load" not in log, log
    assert re.search(r"dbwrap_py: db=\S+/locking\.tdb op=open: adapter", log), log
