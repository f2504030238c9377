"""A stopping node agent never closes its store under one of its own
threads' calls. Python's sqlite3 crashes (SIGSEGV, seen on Python 3.14 in
the sid root's CI run) when a connection is closed while another thread runs
a query on it; other stores' clients may be no kinder. No server needed:
sqlite_leased's cluster file is the store.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dbwrap_py.adapters.sqlite_leased.nodestore import POLL_SECONDS, SqliteNodeStore
from dbwrap_py.nodecache.agent import NodeAgent
from dbwrap_py.nodecache.protocol import NodeLease
from dbwrap_py.nodecache.state import STATE_FILE


class SlowSecondKeepalive(SqliteNodeStore):
    """The second keepalive takes ``slow`` seconds; ``in_call`` is set while
    it runs; ``closed_in_call`` says whether close() came meanwhile."""

    def __init__(self, cluster_file: str, slow: float) -> None:
        super().__init__(cluster_file, op_timeout=5.0)
        self.slow = slow
        self.calls = 0
        self.in_call = threading.Event()
        self.closed_in_call: bool | None = None

    def keepalive(self, lease: NodeLease, timeout: float) -> float:
        self.calls += 1
        if self.calls != 2:
            return super().keepalive(lease, timeout)
        self.in_call.set()
        try:
            time.sleep(self.slow)
            return super().keepalive(lease, timeout)
        finally:
            self.in_call.clear()

    def close(self) -> None:
        self.closed_in_call = self.in_call.is_set()
        super().close()


def agent_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "node-cache"
    directory.mkdir(mode=0o755)
    return directory


def test_a_stopping_agent_waits_for_a_keepalive_in_progress_before_closing_the_store(tmp_path: Path) -> None:
    store = SlowSecondKeepalive(str(tmp_path / "sqlite_leased.cluster"), slow=0.5)
    directory = agent_dir(tmp_path)
    agent = NodeAgent(store, directory, "node0", ttl=0.6)
    agent.start()
    assert store.in_call.wait(5), "the second keepalive came"
    agent.stop()
    agent.run()  # drains: hands back, then revokes and closes
    assert store.closed_in_call is False, "the store was closed while the keepalive was in a call to it"
    time.sleep(0.1)
    assert not (directory / STATE_FILE).exists(), "a late keepalive published the state file again"


def test_the_request_threads_connection_outlives_close_until_it_stops(tmp_path: Path) -> None:
    """The agent closes the store while its request thread may be in a
    query: that thread's connection is its own, closed by the thread itself."""
    store = SqliteNodeStore(str(tmp_path / "sqlite_leased.cluster"), op_timeout=5.0)
    store.grant(b"node0", 5)  # makes the cluster file's tables
    stop = threading.Event()
    failures: list[BaseException] = []

    def listen() -> None:
        try:
            for _ in store.requests(b"node0", stop):
                pass
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    thread = threading.Thread(target=listen)
    thread.start()
    time.sleep(POLL_SECONDS * 4)
    store.close()
    time.sleep(POLL_SECONDS * 20)  # the thread polls on after close()
    stop.set()
    thread.join(5)
    assert not thread.is_alive(), "the request thread ends within a poll of stop"
    assert failures == [], f"the request thread failed after close(): {failures}"
