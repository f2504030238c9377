"""smbd's side of the proxy, attacked from the daemon's side: the bridge's
C client (build/proxy_client, tests/proxy_client/proxy_client.c) against a
daemon that answers as each test tells it (scripted_daemon.py), and the
client fuzzer (dbwrap_py.proxy.fuzz_client) with its broken example.

Each attack must be refused with an NTSTATUS and one log line that names
the cause; each has a control beside it, the same daemon without the
attack, that the client accepts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.fuzz_client import fuzz

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "build" / "proxy_client"
BROKEN_CLIENT = ROOT / "build" / "proxy_client_broken"
TIMEOUT = 10.0
NOBODY = 65534


@pytest.fixture(scope="module", autouse=True)
def built():
    missing = [str(p) for p in (CLIENT, BROKEN_CLIENT) if not p.exists()]
    assert not missing, f"{missing} missing: run make"


@dataclass
class Run:
    statuses: dict[str, list[int]]  # op -> the statuses it returned, in order
    log: list[str]                  # the bridge's log lines (stderr)
    events: list[str]               # what the daemon saw

    def ops_seen(self, conn: int | None = None) -> list[str]:
        return [e.split()[3] for e in self.events if e.split()[2] == "op"
                and (conn is None or e.split()[1] == str(conn))]


class Daemon:
    """scripted_daemon.py in a child process, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, place: Path, scripts: list[dict], uid: int | None = None,
                 drop: str | None = None) -> None:
        self.socket_path = str(place / "s.sock")
        config = place / "config.json"
        config.write_text(json.dumps({"scripts": scripts,
                                      **({"uid": uid, "drop": drop} if uid is not None else {})}))
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("scripted_daemon.py")), self.socket_path,
             str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = self.process.stdout.readline()
        assert first.strip() == "listening", first + self.process.stdout.read()

    def stop(self) -> list[str]:
        """Once the client is gone: everything the daemon saw."""
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=TIMEOUT)
        finally:
            self.process.kill()
        return out.splitlines()


def run_client(place: Path, scripts: list[dict], ops: list[str], *, uid: int | None = None,
               drop: str | None = None, client_as: int | None = None) -> Run:
    """build/proxy_client's ops (proxy_timeout 2 s) against a scripted daemon."""
    daemon = Daemon(place, scripts, uid, drop)
    try:
        argv = [str(CLIENT), daemon.socket_path, "2", *ops]
        if client_as is not None:
            argv = ["setpriv", f"--reuid={client_as}", f"--regid={client_as}", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT)
    finally:
        events = daemon.stop()
    assert done.returncode == 0, done.stderr
    statuses: dict[str, list[int]] = {}
    for line in done.stdout.splitlines():
        op, status = line.split()
        statuses.setdefault(op, []).append(int(status, 16))
    return Run(statuses, done.stderr.splitlines(), events)


def only_line(run: Run, text: str) -> str:
    found = [line for line in run.log if text in line]
    assert len(found) == 1, run.log
    return found[0]


@pytest.fixture
def place():
    """A directory every user may reach (the tests that change users need it)."""
    path = Path(tempfile.mkdtemp(prefix="dbwrap-py-proxy-client-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- a daemon that keeps the rules ------------------------------------------------


def test_a_daemon_that_answers_as_it_should_is_taken(place):
    """The control for each attack below: the same daemon, without it."""
    run = run_client(place, [{}], ["open", "fetch", "close"])
    assert run.statuses == {"open": [0], "fetch": [0], "close": [0]}, run.log
    assert run.ops_seen() == ["HELLO", "OPEN", "NODE_CACHE", "FETCH", "CLOSE"] and not run.log

# -- HELLO's max_message ------------------------------------------------------


@pytest.mark.parametrize("max_message", [wire.MAX_MESSAGE + 1, 0xFFFFFFFF])
def test_a_hello_advertising_more_than_max_message_is_refused(place, max_message):
    """The attack: a daemon that would have every smbd process allocate up
    to 4 GiB per reply on its say-so."""
    run = run_client(place, [{"HELLO": {"hello": [wire.VERSION, max_message]}}], ["open"])
    assert run.statuses == {"open": [nt.NT_STATUS_INVALID_NETWORK_RESPONSE]}
    line = only_line(run, "HELLO advertises")
    assert (f"op=hello: proxy daemon at {place}/s.sock: HELLO advertises messages of up to "
            f"{max_message} bytes, over this client's limit of {wire.MAX_MESSAGE}: refused "
            f"(NTSTATUS 0xc00000c3)") in line
    assert run.ops_seen() == ["HELLO"]  # nothing after it
    assert "conn 0 end" in run.events[-1]


def test_a_hello_advertising_max_message_exactly_is_taken(place):
    run = run_client(place, [{"HELLO": {"hello": [wire.VERSION, wire.MAX_MESSAGE]}}], ["open", "fetch"])
    assert run.statuses == {"open": [0], "fetch": [0]}, run.log
    assert run.ops_seen() == ["HELLO", "OPEN", "NODE_CACHE", "FETCH", "CLOSE"]


# -- an error reply's cause in the log ------------------------------------------


def test_an_error_cause_is_logged_as_one_bounded_printable_line(place):
    """The attack: a cause of 100 kB that carries a newline (a forged second
    log line), a NUL and an escape sequence. It is logged on one line, cut
    to its first 512 bytes, control bytes as '?'."""
    cause = b"first\nforged: db=x op=y: root was here\x00\x1b[2J" + b"A" * 100_000
    script = {"FETCH": {"error": nt.NT_STATUS_DEVICE_NOT_READY, "cause_hex": cause.hex()}}
    run = run_client(place, [script], ["open", "fetch"])
    assert run.statuses == {"open": [0], "fetch": [nt.NT_STATUS_DEVICE_NOT_READY]}
    assert run.log == [only_line(run, "op=fetch")]  # the whole log: one line
    logged = re.fullmatch(r"dbwrap_py: db=\S+ op=fetch: (.*)\.\.\. \(NTSTATUS 0xc00000a3\)", run.log[0])
    assert logged is not None, run.log[0]
    assert logged.group(1) == "first?forged: db=x op=y: root was here??[2J" + "A" * (512 - 43)


# -- who answers on the socket --------------------------------------------------

needs_root = pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (to be another user) and setpriv")


@needs_root
def test_a_daemon_that_is_not_root_is_refused_before_anything_is_sent(place):
    """The attack: another user listening at the socket's path (here: a
    daemon that became nobody between bind() and listen())."""
    run = run_client(place, [{}], ["open"], uid=NOBODY, drop="after-bind")
    assert run.statuses == {"open": [nt.NT_STATUS_ACCESS_DENIED]}
    line = only_line(run, "neither root")
    assert re.search(rf"op=open: proxy daemon at {place}/s.sock: the peer \(pid \d+, uid {NOBODY}\) "
                     rf"is neither root nor this process's user \(uid 0\): refused, nothing sent "
                     rf"\(NTSTATUS 0xc0000022\)", line), line
    assert run.events == ["conn 0 end 0"]  # not one byte, not even HELLO


@needs_root
def test_a_daemon_of_the_clients_own_user_is_taken(place):
    """A client that is not root trusts its own user too (a daemon and its
    clients run by one user); root (smbd) trusts root only, above."""
    run = run_client(place, [{}], ["open"], uid=NOBODY, drop="before-bind", client_as=NOBODY)
    assert run.statuses == {"open": [0]}, run.log
    assert run.ops_seen() == ["HELLO", "OPEN", "NODE_CACHE", "CLOSE"]


# -- found by the client fuzzer -----------------------------------------------------


def test_a_node_cache_reply_cut_short_is_malformed_not_out_of_memory(place):
    cut = wire.reply_ok().u32(100).body()  # records_path claims 100 bytes, and nothing follows
    run = run_client(place, [{"NODE_CACHE": {"raw_hex": cut.hex()}}], ["open", "fetch"])
    assert run.statuses == {"open": [0], "fetch": [0]}  # every call goes to the daemon
    assert "op=node_cache: malformed reply from the proxy daemon (NTSTATUS 0xc0000158)" \
        in only_line(run, "malformed")
    assert "proxy_fastpath: NODE_CACHE failed (NT_STATUS_INTERNAL_DB_ERROR); every call goes " \
        "to the daemon" in only_line(run, "NODE_CACHE failed")


def test_a_request_never_goes_out_with_a_handle_of_a_lost_connection(place):
    """NODE_CACHE, after each OPEN, loses the connection: the database is
    open on a connection that is gone. Its next call opens it again (lost
    again): the FETCH must not follow on a third connection, where handle 1
    names nothing."""
    run = run_client(place, [{"NODE_CACHE": "close"}], ["open", "fetch"])
    assert run.statuses == {"open": [0], "fetch": [nt.NT_STATUS_DEVICE_NOT_READY]}
    assert run.ops_seen(0) == run.ops_seen(1) == ["HELLO", "OPEN", "NODE_CACHE"]
    assert "FETCH" not in run.ops_seen() and not run.ops_seen(2)
    assert "op=fetch: the connection to the proxy daemon was lost as the database opened " \
        "(NTSTATUS 0xc00000a3)" in only_line(run, "lost as the database opened")


def test_write_through_after_a_lost_connection_connects_again(place):
    run = run_client(place, [{"FETCH": "close"}, {}], ["open", "fetch", "write_through"])
    assert run.statuses == {"open": [0], "fetch": [nt.NT_STATUS_DEVICE_NOT_READY], "write_through": [0]}
    assert run.ops_seen(1) == ["HELLO", "OPEN", "NODE_CACHE", "WRITE_THROUGH", "CLOSE"]


def test_write_through_is_not_sent_to_a_daemon_that_agreed_an_older_version(place):
    """The connection it was asked on is gone; the new one agreed version 2."""
    run = run_client(place, [{"FETCH": "close"}, {"HELLO": {"hello": [2, wire.MAX_MESSAGE]}}],
                     ["open", "fetch", "write_through"])
    assert run.statuses["write_through"] == [nt.NT_STATUS_NOT_SUPPORTED]
    assert run.ops_seen(1) == ["HELLO", "OPEN", "NODE_CACHE", "CLOSE"]
    assert "op=write_through: the daemon speaks protocol 2, without write_through (protocol 3): " \
        "update it (NTSTATUS 0xc00000bb)" in only_line(run, "speaks protocol")


# -- the client fuzzer ----------------------------------------------------------------


def test_the_client_survives_a_fuzzing_daemon():
    report = fuzz(CLIENT, seconds=3, seed=11)
    print(report)
    assert not report.failures, report.failures
    assert report.cases > 100 and report.ops and report.ops == report.status_lines
    assert report.by_kind["hello_over_max"] > 0 and report.by_kind["over_limit"] > 0


def test_the_fuzzer_catches_a_client_without_the_max_message_clamp():
    """The broken example: build/proxy_client_broken takes any max_message."""
    report = fuzz(BROKEN_CLIENT, seconds=10, seed=11)
    assert report.failures, report
    assert any(re.search(rf"after a HELLO reply advertising max_message \d+ > {wire.MAX_MESSAGE}", f)
               or "AddressSanitizer" in f for f in report.failures), report.failures
