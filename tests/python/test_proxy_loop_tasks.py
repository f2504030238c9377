"""LoopTasks: the daemon's loop thread as the adapter thread's executor."""

from __future__ import annotations

import threading

import pytest

from dbwrap_py.proxy.loop_tasks import LoopTasks
from dbwrap_py.proxy.shared import mark_adapter_thread, run_on


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


def test_run_on_is_inline_on_the_marked_thread():
    def marked() -> None:
        mark_adapter_thread()
        tasks = LoopTasks(lambda: None)  # never runs anything: an inline call needs no loop
        seen.append(run_on(tasks, lambda: "inline"))

    seen: list[str] = []
    thread = threading.Thread(target=marked)
    thread.start()
    thread.join(10)
    assert seen == ["inline"]


def test_shutdown_runs_what_is_left_then_refuses_more():
    tasks = LoopTasks(lambda: None)
    tasks.bind_to_this_thread()
    ran = []
    tasks.submit(lambda: tasks.submit(lambda: ran.append("late")))
    tasks.shutdown()
    assert ran == ["late"]
    with pytest.raises(RuntimeError):
        tasks.submit(lambda: None)
