"""c_bridge/samba_abi.h: the build refuses a Samba release it was not checked
against, and its layout agrees with what the installed Samba's binaries read
(scripts/samba-abi-probe.sh)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("release", ["4.17.11", "4.25.0", "4.25.2", "4.26.0"])
def test_a_release_not_in_the_table_stops_the_build_naming_it(release):
    # the stamp every C target depends on: nothing is compiled for it
    proc = make("build/samba-version", f"SAMBA_VERSION={release}")
    assert proc.returncode != 0
    assert f"Samba {release} is not a release c_bridge/samba_abi.h was checked against" in proc.stderr
    assert "scripts/samba-abi-probe.sh" in proc.stderr


@pytest.mark.parametrize("release", ["4.17.12", "4.22.11", "4.24.7", "4.25.1"])
def test_the_releases_in_the_table_build(release):
    proc = make("samba-abi-check", f"SAMBA_VERSION={release}")
    assert proc.returncode == 0, proc.stderr


def probe_offsets(text: str) -> dict[str, str]:
    """``dbwrap_wipe: 0x68(%rdi)`` -> {"dbwrap_wipe": "0x68"}; "absent" kept."""
    found = {}
    for name, value in re.findall(r"^\s*(dbwrap_\w+): (.+)$", text, re.M):
        match = re.match(r"\*?(0x[0-9a-f]+)\(%rdi\)", value)
        found[name] = match.group(1) if match else value.strip()
    return found


def test_the_declared_layout_reads_what_the_installed_samba_reads():
    declared = make("samba-abi-offsets")
    assert declared.returncode == 0, declared.stderr
    probed = subprocess.run([str(ROOT / "scripts" / "samba-abi-probe.sh")], capture_output=True,
                            text=True, timeout=60)
    assert probed.returncode == 0, probed.stderr
    ours, samba = probe_offsets(declared.stdout), probe_offsets(probed.stdout)
    assert set(ours) == {"dbwrap_get_seqnum", "dbwrap_wipe", "dbwrap_name", "dbwrap_is_persistent",
                         "dbwrap_record_get_flags"}
    assert ours == samba, f"samba_abi.h:\n{declared.stdout}\nthe installed Samba:\n{probed.stdout}"


def version_number(release: str) -> int:
    """4.25.1 -> 42501, as the Makefile passes it."""
    major, minor, patch = (int(part) for part in release.split("."))
    return major * 10000 + minor * 100 + patch


def test_a_shifted_layout_is_caught_by_the_comparison():
    # the broken example: 4.25's layout declared for the installed release
    # (or 4.24's for a 4.25 one) reads other offsets than Samba's binaries
    installed = make("samba-abi-offsets").stdout
    other = "4.25.1" if "absent" in installed else "4.24.7"
    shifted = subprocess.run(
        ["sh", "-c", f"cc -DDBWRAP_PY_SAMBA_VERSION='\"{other}\"' "
         f"-DDBWRAP_PY_SAMBA_VERSION_NUMBER={version_number(other)} "
         "$(pkg-config --cflags talloc tdb) -Ic_bridge -o build/samba_abi_offsets_other "
         "tests/abi/samba_abi_offsets.c && build/samba_abi_offsets_other"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shifted.returncode == 0, shifted.stderr
    assert probe_offsets(shifted.stdout) != probe_offsets(installed)
