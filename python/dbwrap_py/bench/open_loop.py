"""Opens/s of SMB clients in bins of any width: build/smb_open_loop.

smbtorture's path-contention-shared prints one sample a second; make
bench-elastic wants 0.5 s bins. bench/smb_open_loop.c forks the clients
(libsmbclient, one context each, spread round-robin over the given
throwaway Sambas), connects them all, starts one clock, and counts each
completed open (read-only) and close of one file into the bin it ended in.

open_loop() runs it and returns its bins as smbtorture.Rates, so
elastic.py's analysis takes either:

* ``seconds``: each bin's END since the common start (0.5, 1.0, ... for
  0.5 s bins): a sample labelled t counts the bin that ends at t;
* ``opens``: opens per SECOND in that bin (its count / ``bin_seconds``), so
  rates compare across bin widths; ``counts`` keeps the raw counts;
* ``closes``: the same as ``opens`` (each counted open was closed);
* no latencies.

A run is ok when every client connected, ran to the end and no open or
close failed; otherwise ``cause`` says why: the program's stderr, the
clients' first errors, then smbd's errors from every node's log since the
start.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dbwrap_py.errors import ConfigError
from dbwrap_py.explain import smbd_problems
from dbwrap_py.paths import open_loop_program
from dbwrap_py.samba import ThrowawaySamba
from dbwrap_py.servers import read_lines_until
from dbwrap_py.smbtorture import Rates

#: the file every client opens, in the share's folder
DEFAULT_PATH = "open-loop"
#: what the program prints once every client is connected and the clock started
RUNNING = "RUNNING"
#: the program's own bound on its clients after the end (--grace)
GRACE_SECONDS = 30
#: beyond the program's own bounds, before it is killed from here
MARGIN_SECONDS = 30


@dataclass
class BinnedRates(Rates):
    """smbtorture.Rates from bins (see the module's docstring)."""

    bin_seconds: float = 0.5
    #: completed open+close pairs per bin
    counts: list[int] = field(default_factory=list)
    #: failed opens and closes, and clients that did not connect
    errors: int = 0
    #: each failing client's first error: "CLIENT URL: TEXT"
    client_errors: list[str] = field(default_factory=list)
    #: the RUNNING line came (all connected, the clock started)
    running: bool = False
    returncode: int | None = None


def connect_timeout(nprocs: int) -> int:
    """Seconds the clients may take to connect, all of them (as smbtorture.point_timeout)."""
    return 60 + math.ceil(nprocs / 4)


def run_timeout(nprocs: int, seconds: float) -> float:
    """When the program is killed from here: past every bound of its own."""
    return seconds + connect_timeout(nprocs) + GRACE_SECONDS + MARGIN_SECONDS


def bin_milliseconds(seconds: float, bin_seconds: float) -> int:
    """``bin_seconds`` in whole milliseconds; refuses a run that is not a
    whole number of bins."""
    bin_ms = round(bin_seconds * 1000)
    run_ms = round(seconds * 1000)
    if bin_ms < 1 or abs(bin_ms - bin_seconds * 1000) > 1e-6:
        raise ConfigError(f"bin of {bin_seconds:g} s: a whole number of milliseconds, at least 1")
    if run_ms < 1 or run_ms % bin_ms:
        raise ConfigError(f"a run of {seconds:g} s is not a whole number of {bin_seconds:g} s bins")
    return bin_ms


def share_url(samba: ThrowawaySamba) -> str:
    """smb://ADDRESS:PORT/SHARE of a throwaway Samba's share (its unc is //ADDRESS/SHARE)."""
    share = samba.unc.rstrip("/").rsplit("/", 1)[1]
    return f"smb://{samba.setup.address}:{samba.port}/{share}"


def open_loop_command(program: Path, sambas: Sequence[ThrowawaySamba], nprocs: int, seconds: float,
                      bin_seconds: float, path: str, user: str) -> list[str]:
    """The program's command line; the password goes in $PASSWD (open_loop_environment)."""
    return [str(program), "--user", user, "--time", f"{seconds:g}",
            "--bin-ms", str(bin_milliseconds(seconds, bin_seconds)), "--clients", str(nprocs),
            "--path", path, "--connect-timeout", str(connect_timeout(nprocs)),
            "--grace", str(GRACE_SECONDS), *(share_url(s) for s in sambas)]


def open_loop_environment(password: str) -> dict[str, str]:
    """This process's environment with the password in $PASSWD, off the
    command line; no LD_PRELOAD (the client must not load the bridge)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PASSWD"] = password
    return env


def split_credentials(credentials: str) -> tuple[str, str]:
    """USER%PASSWORD as (user, password)."""
    user, percent, password = credentials.partition("%")
    if not user or not percent:
        raise ConfigError("credentials: USER%PASSWORD")
    return user, password


def parse_output(stdout: str, bin_seconds: float) -> BinnedRates:
    """The bins, errors and RUNNING of the program's stdout."""
    rates = BinnedRates(bin_seconds=bin_seconds)
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == RUNNING:
            rates.running = True
        elif word == "bin":
            start, count = rest.split()
            rates.seconds.append(round(float(start) + bin_seconds, 6))
            rates.counts.append(int(count))
        elif word == "errors":
            rates.errors = int(rest)
        elif word == "error":
            rates.client_errors.append(rest)
    # floats (Rates says int): per second, whatever the bin's width
    rates.opens = [n / bin_seconds for n in rates.counts]  # type: ignore[assignment]
    rates.closes = list(rates.opens)
    return rates


def prepare_file(sambas: Sequence[ThrowawaySamba], path: str) -> None:
    """FILE in the share's folder, readable by the test user (the nodes of a
    cluster share sambas[0]'s folder)."""
    if not path or path.startswith("/") or ".." in Path(path).parts:
        raise ConfigError(f"path {path!r}: a relative path inside the share")
    target = sambas[0].share_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.touch(mode=0o666, exist_ok=True)


def open_loop(sambas: Sequence[ThrowawaySamba], workdir: Path, nprocs: int, seconds: float,
              bin_seconds: float = 0.5, on_running: Callable[[], None] | None = None,
              path: str = DEFAULT_PATH, credentials: str | None = None) -> BinnedRates:
    """``nprocs`` clients opening and closing ``path`` on ``sambas`` (spread
    round-robin) for ``seconds``, counted in ``bin_seconds`` bins; opens are
    per second in each bin (count / bin_seconds). ``on_running`` is called
    once every client is connected, as the first bin begins; it must return
    at once. ``workdir``: the program's working directory; ``credentials``:
    USER%PASSWORD (default: the throwaway Sambas' test user). A failed or
    hung run comes back with its cause."""
    if not sambas or nprocs < 1:
        raise ConfigError(f"open_loop: {nprocs} clients on {len(sambas)} Sambas; at least one of each")
    user, password = split_credentials(credentials or sambas[0].credentials)
    command = open_loop_command(open_loop_program(), sambas, nprocs, seconds, bin_seconds, path, user)
    prepare_file(sambas, path)
    starts = [samba.log_position() for samba in sambas]
    timeout = run_timeout(nprocs, seconds)
    returncode, stdout, stderr, timed_out = _run(command, open_loop_environment(password), workdir,
                                                 timeout, on_running)
    rates = parse_output(stdout, bin_seconds)
    rates.output, rates.returncode, rates.timed_out = stdout + stderr, returncode, timed_out
    expected = round(seconds * 1000) // bin_milliseconds(seconds, bin_seconds)
    rates.ok = (returncode == 0 and not timed_out and rates.running and rates.errors == 0
                and len(rates.counts) == expected)
    if not rates.ok:
        logs = "\n".join(samba.log_since(start) for samba, start in zip(sambas, starts))
        rates.cause = failure_cause(rates, stderr, logs, expected, timeout)
    return rates


def failure_cause(rates: BinnedRates, stderr: str, smbd_logs: str, expected: int,
                  timeout: float) -> list[str]:
    """Why a run is not ok, one line each: the program's side, then smbd's; never empty."""
    lines = [f"smb_open_loop ran past {timeout:g} s and was killed"] if rates.timed_out else []
    lines += [line.strip() for line in stderr.splitlines() if line.strip()]
    if rates.errors and rates.returncode == 0:
        lines.append(f"smb_open_loop: {rates.errors} opens or closes failed; each client's first:")
        lines += [f"smb_open_loop: client {e}" for e in rates.client_errors]
    if rates.running and rates.returncode == 0 and len(rates.counts) != expected:
        lines.append(f"smb_open_loop printed {len(rates.counts)} of {expected} bins")
    lines += [f"smbd: {m}" for m in smbd_problems(smbd_logs)]
    return lines or [f"smb_open_loop exited with {rates.returncode}, said nothing on stderr, "
                     "and smbd logged no error"]


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout: float,
         on_running: Callable[[], None] | None) -> tuple[int | None, str, str, bool]:
    """(exit status, stdout, stderr, timed out): stdout read as it comes,
    ``on_running`` called at the RUNNING line; killed by its PID after
    ``timeout`` (its clients die with it: PR_SET_PDEATHSIG)."""
    with tempfile.TemporaryFile() as errors, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=cwd,
            stdin=subprocess.DEVNULL) as process:
        lines, expired = read_lines_until(process, timeout, lambda line: line.strip() == RUNNING, on_running)
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
    return process.returncode, "".join(lines), stderr, expired
