"""dbwrap_py.servers: what every throwaway server shares."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dbwrap_py.servers import JIT_VARIABLE, ServerError, dying_with_parent, jvm_jit_flags, pause_process


def _cmd(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0")[0]


def test_a_server_dies_with_the_thread_that_started_it_and_keeps_its_pid():
    """An interrupted run leaves no server behind: the parent-death signal
    is set by setpriv before it execs the server (no Python runs in the
    forked child)."""
    started: list[subprocess.Popen[bytes]] = []
    let_go = threading.Event()

    def start() -> None:
        started.append(subprocess.Popen(dying_with_parent(["sleep", "60"])))
        let_go.wait(10)

    starter = threading.Thread(target=start)
    starter.start()
    deadline = time.monotonic() + 5
    while not started or _cmd(started[0].pid) != b"sleep":  # setpriv exec'd it: the same PID
        assert time.monotonic() < deadline, "the server never ran"
        time.sleep(0.01)
    server = started[0]
    assert server.poll() is None
    let_go.set()
    starter.join()
    deadline = time.monotonic() + 5
    while server.poll() is None:
        assert time.monotonic() < deadline, f"server {server.pid} outlived the thread that started it"
        time.sleep(0.05)
    assert server.returncode == -9


BUSY_THREADS = """
import threading
def spin():
    while True:
        pass
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
threading.Event().wait()
"""


def test_pause_returns_once_every_thread_has_stopped():
    """A paused server answers nothing from the moment pause_process returns:
    each of its threads, busy on a core, is stopped by then."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY_THREADS], stdout=subprocess.PIPE)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == b"spinning\n"
        pause_process(busy.pid)
        tasks = os.listdir(f"/proc/{busy.pid}/task")
        assert len(tasks) == 4
        for task in tasks:
            with open(f"/proc/{busy.pid}/task/{task}/stat") as stat:
                assert stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    finally:
        os.kill(busy.pid, signal.SIGKILL)
        os.kill(busy.pid, signal.SIGCONT)
        busy.wait()


def test_the_jvm_servers_jit_is_c1_only_when_quick_and_a_bad_value_is_refused(monkeypatch):
    """Tests ask for C1 only; benchmarks, and a run that says nothing, get
    the JVM's own tiered JIT; a typo is an error, not a silent default."""
    monkeypatch.setenv(JIT_VARIABLE, "quick")
    assert jvm_jit_flags() == ["-XX:TieredStopAtLevel=1"]
    monkeypatch.setenv(JIT_VARIABLE, "full")
    assert jvm_jit_flags() == []
    monkeypatch.delenv(JIT_VARIABLE)
    assert jvm_jit_flags() == []
    monkeypatch.setenv(JIT_VARIABLE, "fast")
    with pytest.raises(ServerError, match="quick or full"):
        jvm_jit_flags()


def test_backend_options_put_a_node_agent_beside_a_throwaway_store():
    """The framework, not the adapter, starts the node agent: sqlite_leased's
    throwaway store is a cluster file, and node_cache=yes gets an agent on
    it whose cache directory goes with the run."""
    from pathlib import Path

    from dbwrap_py.servers import backend_options

    with backend_options("sqlite_leased", {"node_cache": "yes"}) as reach:
        cache_dir = Path(reach["node_cache_dir"])
        assert reach["cluster_file"] and (cache_dir / "agent.lock").exists()
    assert not cache_dir.exists()
    with backend_options("sqlite_leased", {}) as reach:
        assert reach == {}  # nothing asked for, nothing started


def test_variants_of_a_conformance_run_share_one_throwaway_store(monkeypatch):
    """run_suites enters the adapter's throwaway store once for every table."""
    import contextlib

    from dbwrap_py.conformance import run_suites
    from dbwrap_py.testing.hooks import hooks_for

    hooks = hooks_for("sqlite_leased")
    entered = []
    original = hooks.throwaway_server

    def counting(options):
        server = original(options)
        if server is None:
            return None

        @contextlib.contextmanager
        def counted():
            entered.append(dict(options))
            with server as reach:
                yield reach
        return counted()

    monkeypatch.setattr(hooks, "throwaway_server", counting)
    runs = run_suites("sqlite_leased", {"node_cache": "yes"}, [{"lease": "3"}], only=["lock.counter"])
    assert [run.ok for run in runs] == [True, True]
    assert len(entered) == 1, entered


def test_an_adapter_without_hooks_gets_the_defaults():
    """tdb has no test hooks: no throwaway store, nothing counted."""
    from dbwrap_py.testing.hooks import TestHooks, hooks_for

    assert type(hooks_for("tdb")) is TestHooks
    assert hooks_for("tdb").throwaway_server({}) is None and hooks_for("tdb").store_counters({}) == {}


def test_no_runtime_module_imports_a_throwaway_server():
    """The adapters, the daemon, the agent and the CLI load no throwaway
    server or test hook: those are found by name only when a run asks."""
    import json
    import subprocess
    import sys

    modules = ["dbwrap_py.database", "dbwrap_py.proxy.daemon", "dbwrap_py.nodecache.agent", "dbwrap_py.cli",
               *(f"dbwrap_py.adapters.{name}" for name in
                 ("tdb", "memory", "sqlite", "sqlite_leased", "etcd", "rados", "cassandra", "fdb", "zookeeper"))]
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('dbwrap_py.testing'))))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(run.stdout) == []


def test_a_prototype_derived_from_a_registered_adapter_gets_its_hooks():
    """A dotted adapter name (the conformance suite's broken sqlite_leased,
    the cluster tests' broken etcd) is tested on its base's throwaway store."""
    from dbwrap_py.testing.hooks import hooks_for

    assert hooks_for("dbwrap_py.conformance.broken.no_fencing") is hooks_for("sqlite_leased")
    assert hooks_for("dbwrap_py.testing.skips_write_through") is hooks_for("etcd")


def test_zookeepers_srvr_answer_is_read_whole_and_its_mode_found():
    """The throwaway ZooKeeper's readiness probe and leader() read srvr's
    Mode line, which may come after the first segment of the answer."""
    import socket

    import pytest

    from dbwrap_py.testing.servers.zookeeper import ZooKeeperServer, four_letters, free_ports, mode_of

    answer = [b"Zookeeper version: 3.8.4\nLatency min/avg/max: 0/0.1/3\n", b"Zxid: 0x100000004\nMode: follower\n"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                assert conn.recv(4) == b"srvr"
                for part in answer:
                    conn.sendall(part)
                    time.sleep(0.05)

        server = threading.Thread(target=serve)
        server.start()
        reply = four_letters("127.0.0.1", listener.getsockname()[1], b"srvr", timeout=5.0)
        server.join(10)
    assert reply == b"".join(answer)
    assert mode_of(reply) == "follower"
    assert mode_of(b"This ZooKeeper instance is not currently serving requests\n") == ""
    assert len(set(free_ports(9))) == 9
    for nodes in (0, 2, 5):  # standalone or three
        with pytest.raises(ValueError):
            ZooKeeperServer(nodes=nodes)


def test_a_logs_end_is_one_line_ending_with_its_last_lines(tmp_path):
    from dbwrap_py.servers import log_end

    log = tmp_path / "agent.log"
    log.write_text("node-agent[1]: metrics on http://10.0.0.1:1/metrics\n\n" +
                   "".join(f"line {n}\n" for n in range(10)) + "connect: no server answered\n")
    end = log_end(log)
    assert "\n" not in end and end.endswith("line 9 | connect: no server answered")
    assert "metrics" not in end and end.startswith("line 5 | ") and "line 4" not in end
    assert len(log_end(log, chars=20)) == 20
    log.write_text("")
    assert log_end(log) == "(its log is empty)"
    assert "cannot be read" in log_end(tmp_path / "missing.log")
