"""The per-process client registry (dbwrap_py.sessions)."""

from __future__ import annotations

import os
import threading

import pytest

from dbwrap_py.sessions import Sessions
from dbwrap_py.testing.forked import in_forked_child


class Client:
    def __init__(self, key: str) -> None:
        self.key, self.pid, self.closed = key, os.getpid(), False


def test_one_client_per_key_made_on_first_use():
    sessions: Sessions[Client] = Sessions("test")
    made: list[str] = []

    def factory(key: str):
        return lambda: made.append(key) or Client(key)

    a = sessions.client_for("a", factory("a"))
    assert sessions.client_for("a", factory("a")) is a
    assert sessions.client_for("b", factory("b")) is not a
    assert made == ["a", "b"]


def test_a_failed_factory_keeps_nothing():
    sessions: Sessions[Client] = Sessions("test")

    def broken() -> Client:
        raise ConnectionError("no server")

    with pytest.raises(ConnectionError):
        sessions.client_for("a", broken)
    assert sessions.clients() == []
    assert sessions.client_for("a", lambda: Client("a")).key == "a"


def test_close_all_closes_and_forgets_this_process_clients():
    sessions: Sessions[Client] = Sessions("test")
    a = sessions.client_for("a", lambda: Client("a"))
    sessions.close_all(lambda client: setattr(client, "closed", True))
    assert a.closed and sessions.clients() == []
    assert sessions.client_for("a", lambda: Client("a")) is not a


def test_a_forked_child_makes_its_own_and_leaves_the_parents_alone():
    sessions: Sessions[Client] = Sessions("test")
    parent = sessions.client_for("a", lambda: Client("a"))

    def child(result: dict) -> None:  # in the forked child
        result["inherited"] = len(sessions.clients())
        sessions.close_all(lambda client: setattr(client, "closed", True))  # nothing of the parent's
        mine = sessions.client_for("a", lambda: Client("a"))
        result["own"] = mine is not parent and mine.pid == os.getpid()
        result["parent_closed"] = parent.closed

    result = in_forked_child(child)
    assert result == {"inherited": 0, "own": True, "parent_closed": False}
    assert sessions.client_for("a", lambda: Client("b")) is parent


def test_a_child_forked_while_another_thread_connects_can_still_connect():
    """A parent's thread inside the registry's lock across fork() (a slow
    connect, to a dead server say) left the child's client_for waiting for
    good: the cassandra adapter's fault tests' workers hung so."""
    sessions: Sessions[Client] = Sessions("test")
    connecting, release = threading.Event(), threading.Event()

    def slow() -> Client:
        connecting.set()
        release.wait(10)
        return Client("slow")

    thread = threading.Thread(target=sessions.client_for, args=("slow", slow))
    thread.start()
    assert connecting.wait(10)
    pid = os.fork()
    if pid == 0:
        done = threading.Event()
        worker = threading.Thread(target=lambda: sessions.client_for("a", lambda: Client("a")) and done.set(),
                                  daemon=True)
        worker.start()
        os._exit(0 if done.wait(2) else 1)
    release.set()
    thread.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
