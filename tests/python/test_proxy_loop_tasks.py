"""LoopTasks: the daemon's loop thread as the adapter thread's executor;
and the lease renewals it is asked to run."""

from __future__ import annotations

import threading

import pytest

from dbwrap_py.proxy.locks import Outcome
from dbwrap_py.proxy.loop_tasks import LoopTasks
from dbwrap_py.proxy.shared import SharedDatabase, run_on


def test_tasks_run_in_order_on_the_loop_thread_only_when_it_runs_them():
    woken = []
    tasks = LoopTasks(lambda: woken.append(True))
    tasks.bind_to_this_thread()
    ran: list[tuple[int, int]] = []
    for n in range(3):
        tasks.submit(lambda n=n: ran.append((n, threading.get_ident())))
    assert ran == [] and tasks.pending() and not woken  # the loop's own submits wake nobody
    tasks.run_pending()
    assert ran == [(n, threading.get_ident()) for n in range(3)] and not tasks.pending()


def test_a_task_queued_by_a_task_waits_for_the_next_turn():
    tasks = LoopTasks(lambda: None)
    tasks.bind_to_this_thread()
    ran = []
    tasks.submit(lambda: (ran.append("first"), tasks.submit(lambda: ran.append("second"))))
    tasks.run_pending()
    assert ran == ["first"] and tasks.pending()  # the sockets get a look in between
    tasks.run_pending()
    assert ran == ["first", "second"]


def test_another_threads_call_wakes_the_loop_and_gets_the_result_or_the_error():
    wake = threading.Event()
    tasks = LoopTasks(wake.set)
    tasks.bind_to_this_thread()
    results = []

    def caller() -> None:
        results.append(run_on(tasks, lambda: threading.get_ident()))
        try:
            run_on(tasks, lambda: 1 / 0)
        except ZeroDivisionError:
            results.append("raised")

    other = threading.Thread(target=caller)
    other.start()
    for _ in range(2):  # the loop: wait to be woken, run what came
        assert wake.wait(10)
        wake.clear()
        tasks.run_pending()
    other.join(10)
    assert results == [threading.get_ident(), "raised"]


def test_run_on_is_inline_on_the_loop_thread():
    tasks = LoopTasks(lambda: None)  # never runs anything: an inline call needs no loop
    tasks.bind_to_this_thread()
    assert run_on(tasks, lambda: "inline") == "inline" and not tasks.pending()


def test_a_posted_tasks_exception_is_logged_and_the_next_task_runs(capfd):
    tasks = LoopTasks(lambda: None)
    tasks.bind_to_this_thread()
    ran = []
    tasks.post(lambda: 1 / 0)
    tasks.post(lambda: ran.append("next"))
    tasks.run_pending()
    assert ran == ["next"]
    assert "internal error in a connection's task: ZeroDivisionError" in capfd.readouterr().err


def test_shutdown_runs_what_is_left_then_refuses_more():
    tasks = LoopTasks(lambda: None)
    tasks.bind_to_this_thread()
    ran = []
    tasks.submit(lambda: tasks.submit(lambda: ran.append("late")))
    tasks.shutdown()
    assert ran == ["late"]
    with pytest.raises(RuntimeError):
        tasks.submit(lambda: None)


class _LeasedDb:
    """What SharedDatabase asks of a Database whose locks expire."""

    def __init__(self) -> None:
        self.renewals = 0

    def lock_renewal_seconds(self) -> float:
        return 1.0

    def keep_locks_alive(self) -> None:
        self.renewals += 1


def test_renewals_run_only_while_a_record_is_held_and_an_idle_database_sets_no_timer():
    tasks = LoopTasks(lambda: None)
    tasks.bind_to_this_thread()
    db = _LeasedDb()
    shared = SharedDatabase(("db", "leased"), (), db, tasks)  # type: ignore[arg-type]
    assert shared.renew(100.0) is None  # nothing held: the loop may sleep
    assert shared.locks.acquire("conn", b"k", lambda: None, lambda: None, None) is Outcome.HELD
    assert shared.renew(200.0) == 201.0  # the hold is new: due a period after it
    assert shared.renew(200.5) == 201.0 and not tasks.pending()
    assert shared.renew(201.0) == 202.0
    tasks.run_pending()
    assert db.renewals == 1
    shared.locks.release("conn", b"k")
    assert shared.renew(203.0) is None
    tasks.run_pending()
    assert db.renewals == 1
