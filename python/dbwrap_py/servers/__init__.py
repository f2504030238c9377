"""Throwaway backend servers for tests and benchmarks.

Each server binds to 127.0.0.1 only, keeps its data in a temporary directory,
and is stopped by PID (never by name) when its context manager exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar


_Reach = TypeVar("_Reach")
_Self = TypeVar("_Self", bound="StartStop")
#: util-linux's setpriv (in every Debian root): sets the parent-death signal, then execs
_SETPRIV = shutil.which("setpriv")


class ServerError(RuntimeError):
    """A throwaway server could not be started (not installed, no port, ...)."""


#: the environment variable that picks the JIT of the throwaway JVM servers
#: (Cassandra, ZooKeeper): "quick" or "full"
JIT_VARIABLE = "DBWRAP_PY_SERVER_JIT"


def jvm_jit_flags() -> list[str]:
    """The JIT flags for a throwaway JVM server. "quick" (the test targets
    of the Makefile set it) compiles with C1 only: a one-node Cassandra is
    ready after 7 CPU-s instead of 14, and a conformance table on it takes
    112 CPU-s instead of 142 in the same wall time. "full" (the default, and
    every benchmark's) keeps the JVM's tiered JIT, whose C2 code a
    benchmark's steady state needs. Anything else is refused."""
    jit = os.environ.get(JIT_VARIABLE, "full")
    if jit == "quick":
        return ["-XX:TieredStopAtLevel=1"]
    if jit == "full":
        return []
    raise ServerError(f"{JIT_VARIABLE}={jit!r}: give quick or full")


def log_end(path: "os.PathLike[str] | str", lines: int = 6, chars: int = 800) -> str:
    """The last ``lines`` non-empty lines of a process's log, on one line
    (" | " between them, at most ``chars`` characters): a failure's cause
    that a report showing the first line of an error keeps."""
    try:
        with open(path, errors="replace") as log:
            text = log.read()
    except OSError as exc:
        return f"(its log {path} cannot be read: {exc.strerror})"
    end = " | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])
    return (end[-chars:] if len(end) > chars else end) or "(its log is empty)"


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` made to get SIGKILL when the thread that starts it dies
    (PR_SET_PDEATHSIG), so an interrupted run leaves no server behind. It is
    set by setpriv, which then execs ``argv`` (same PID), and not by a
    preexec_fn: that runs Python in the forked child, and CPython 3.11 hung
    there (PyOS_AfterFork_Child waiting for a thread-state lock that a
    librados callback thread held at the fork)."""
    if _SETPRIV is None:  # not util-linux: servers just outlive a crashed parent
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def start_python_module(module: str, args: Sequence[str] = (), *, dying: bool = False,
                        stdin: int | None = None, stdout: int | None = None) -> subprocess.Popen[bytes]:
    """``python -I -m module args`` in this interpreter, in ``/``; with
    ``dying``, made ``dying_with_parent``.

    A helper started from smbd runs as root wherever smbd's process happens
    to be (a share's directory, which its users write), and ``python -m``
    puts the current directory first on sys.path: a ``dbwrap_py.py`` or
    ``json.py`` planted there would run as root. ``-I`` (isolated) leaves
    the current directory and every PYTHON* variable out, and ``/`` is no
    one's to plant in. The venv's site-packages stay (sys.executable is the
    venv's python, whose pyvenv.cfg sets them up), and with them the
    installed ``dbwrap_py``, editable or not: all these helpers import."""
    argv = [sys.executable, "-I", "-m", module, *args]
    return subprocess.Popen(dying_with_parent(argv) if dying else argv, cwd="/", stdin=stdin, stdout=stdout)


def read_lines_until(process: subprocess.Popen, timeout: float, marker: Callable[[str], bool],
                     on_marker: Callable[[], None] | None) -> tuple[list[str], bool]:
    """A running ``process``'s stdout (text), read line by line as it comes
    until it ends; ``on_marker`` is called at the first line ``marker``
    accepts. Killed by its PID ``timeout`` seconds after the call. The
    lines, and whether the timeout killed it."""
    lines: list[str] = []
    expired = threading.Event()  # set before the kill, so seen once its output ends

    def kill() -> None:
        expired.set()
        process.kill()

    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    marked = False
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if not marked and marker(line):
                marked = True
                if on_marker is not None:
                    on_marker()
        process.wait()
    except BaseException:
        process.kill()
        raise
    finally:
        watchdog.cancel()
    return lines, expired.is_set()


def stop_process(process: subprocess.Popen, sig: int, timeout: float = 30.0) -> None:
    """Send ``sig`` to ``process`` (by its PID) and wait for it; SIGKILL after
    ``timeout``. SIGCONT follows the signal: a paused server must act on it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)
            os.kill(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pause_process(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped: the
    signal is only queued when kill() returns, and a thread already running
    on the other core went on answering a request (an etcd served a read
    after its pause, in a loaded make test)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not _all_threads_stopped(pid):
        if time.monotonic() > deadline:
            raise ServerError(f"process {pid} did not stop within {timeout:g} s of SIGSTOP")
        time.sleep(0.005)


def _all_threads_stopped(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # gone: nothing left to answer
        return True
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # that thread exited
        if state not in ("T", "t"):
            return False
    return True


class StartStop:
    """``with`` over start() and stop(): a start that fails part-way stops
    what it began before the error goes on."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process_group(process: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
    """End ``process`` and everything else in the process group it leads
    (started with ``start_new_session``), by its PID: ``sig``, then SIGKILL
    if the group is not gone after ``grace`` seconds. Reaps the leader."""
    pgid = process.pid
    for signum, wait in ((sig, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            break
        if _group_gone(pgid, wait):
            break
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _group_gone(pgid: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        try:  # reap the leader, so it does not linger as a zombie
            os.waitpid(pgid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def backend_options(adapter: str, options: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """``options``, plus what a run needs beside them, each started only when
    they name none: the adapter's throwaway store (its endpoint), a node
    agent on it for ``node_cache`` (its ``node_cache_dir``), and a node
    daemon for ``transport=proxy`` (its ``proxy_socket``); they stop on exit."""
    from dbwrap_py.nodecache.agent import agent_beside  # it imports this module
    from dbwrap_py.testing.hooks import hooks_for

    with contextlib.ExitStack() as stack:
        server = hooks_for(adapter).throwaway_server(options)
        reach = dict(options) if server is None else {**options, **stack.enter_context(server)}
        reach.update(stack.enter_context(agent_beside(adapter, reach)))
        if reach.get("transport") == "proxy" and not reach.get("proxy_socket"):
            from dbwrap_py.proxy.daemon import ProxyDaemonProcess  # its own threads: only when asked
            daemon = stack.enter_context(ProxyDaemonProcess())
            reach["proxy_socket"] = str(daemon.socket_path)
        yield reach


def serve_until_stopped(server: AbstractContextManager[_Reach],
                        banner: Callable[[_Reach], str]) -> None:
    """Start ``server``, print ``banner`` of what it gives, and keep it up
    until SIGTERM or Ctrl-C; on the way out it stops and removes its data."""

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        with server as reach:
            print(f"{banner(reach)}\nSIGTERM or Ctrl-C stops it and removes its data", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    finally:
        signal.signal(signal.SIGTERM, previous)
