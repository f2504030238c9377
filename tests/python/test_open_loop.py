"""build/smb_open_loop (bench/smb_open_loop.c) through open_loop(), against
a real throwaway Samba on native tdb: its bins, its RUNNING line, and the
causes it gives when clients cannot log on or the share does not exist.

The binary is built here with make if it is missing (it needs
libsmbclient-dev, which make deps installs); the tests skip, saying why,
if it cannot be built.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dbwrap_py.bench.open_loop import bin_milliseconds, open_loop, parse_output
from dbwrap_py.errors import ConfigError
from dbwrap_py.paths import build_dir
from dbwrap_py.samba import TEST_USER, ThrowawaySamba
from dbwrap_py.smbtorture import setup_for

ROOT = Path(__file__).resolve().parents[2]
server = pytest.mark.server


@pytest.fixture(scope="module")
def program() -> Path:
    """build/smb_open_loop, built if missing; a skip naming why it cannot be."""
    path = build_dir() / "smb_open_loop"
    if path.exists():
        return path
    made = subprocess.run(["make", "-s", "--no-print-directory", "build/smb_open_loop"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if made.returncode != 0 or not path.exists():
        tail = " | ".join((made.stdout + made.stderr).strip().splitlines()[-3:])
        pytest.skip(f"make build/smb_open_loop failed ({made.returncode}): {tail}")
    return path


@pytest.fixture(scope="module")
def samba(program: Path) -> Iterator[ThrowawaySamba]:
    with ThrowawaySamba(setup_for("native")) as instance:
        yield instance


class OtherShare:
    """A throwaway Samba as open_loop sees it, but naming another share."""

    def __init__(self, samba: ThrowawaySamba, share: str) -> None:
        self._samba = samba
        self.unc = f"//{samba.setup.address}/{share}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._samba, name)


# -- without a server --------------------------------------------------------------


def test_bins_are_labelled_by_their_end_and_counted_per_second():
    rates = parse_output("RUNNING\nbin 0.000 10\nbin 0.500 12\nerrors 0\n", 0.5)
    assert rates.running and rates.errors == 0
    assert rates.seconds == [0.5, 1.0]
    assert rates.counts == [10, 12]
    assert rates.opens == [20.0, 24.0] == rates.closes


def test_each_clients_first_error_is_kept():
    rates = parse_output("errors 3\nerror 1 smb://h:1/test: open: Permission denied (errno 13)\n", 0.5)
    assert not rates.running and rates.errors == 3
    assert rates.client_errors == ["1 smb://h:1/test: open: Permission denied (errno 13)"]


@pytest.mark.parametrize("seconds, bin_seconds", [(3, 0.4), (2, 0.0001), (2, 0)])
def test_a_run_that_is_no_whole_number_of_bins_is_refused(seconds, bin_seconds):
    with pytest.raises(ConfigError, match="whole number"):
        bin_milliseconds(seconds, bin_seconds)


# -- against smbd ------------------------------------------------------------------


@server
def test_two_clients_for_two_seconds_fill_four_half_second_bins(samba, tmp_path):
    rates = open_loop([samba], tmp_path, 2, 2, bin_seconds=0.5)
    assert rates.ok, rates.cause
    assert rates.seconds == [0.5, 1.0, 1.5, 2.0]
    assert all(n > 0 for n in rates.counts), rates.counts
    # an open and a close take at least a few microseconds each: at most
    # 100000 pairs per client-second; at least one per bin per client
    assert 4 * 2 <= sum(rates.counts) <= 2 * 2 * 100_000, rates.counts
    assert rates.opens == [n / 0.5 for n in rates.counts]
    assert rates.errors == 0 and not rates.client_errors


@server
def test_running_comes_once_before_the_bins_as_the_clock_starts(samba, tmp_path):
    called: list[float] = []
    rates = open_loop([samba], tmp_path, 2, 2, on_running=lambda: called.append(time.monotonic()))
    ended = time.monotonic()
    assert rates.ok, rates.cause
    lines = rates.output.splitlines()
    assert lines.count("RUNNING") == 1
    assert lines.index("RUNNING") < min(i for i, line in enumerate(lines) if line.startswith("bin "))
    assert len(called) == 1
    assert ended - called[0] >= 1.9  # called at the start, not when the run ended


@server
def test_a_wrong_password_fails_with_the_logon_failure(samba, tmp_path):
    called: list[bool] = []
    rates = open_loop([samba], tmp_path, 2, 1, credentials=f"{TEST_USER}%not-the-password",
                      on_running=lambda: called.append(True))
    assert not rates.ok and not rates.running and not called
    assert rates.counts == []
    cause = "\n".join(rates.cause)
    assert "logon failure" in cause
    assert "The attempted logon is invalid" in cause  # libsmbclient's text of smbd's status
    assert rates.returncode not in (0, None)


@server
def test_a_share_that_does_not_exist_fails_naming_it(samba, tmp_path):
    rates = open_loop([OtherShare(samba, "no-such-share")], tmp_path, 1, 1)  # type: ignore[list-item]
    assert not rates.ok and not rates.running
    cause = "\n".join(rates.cause)
    assert "smb://127.0.0.1:" in cause and "/no-such-share" in cause
    assert "no share of that name" in cause
    assert "No such file or directory" in cause


@server
def test_the_clients_take_the_urls_in_turn(samba, tmp_path):
    # client 0 on the test share, client 1 on one that does not exist
    rates = open_loop([samba, OtherShare(samba, "no-such-share")], tmp_path, 2, 1)  # type: ignore[list-item]
    assert not rates.ok
    assert [e.split()[:2] for e in rates.client_errors] == [["1", f"smb://127.0.0.1:{samba.port}/no-such-share:"]]
