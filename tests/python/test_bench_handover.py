"""bench handover: one hot record, processes on two nodes through the node
cache (sqlite_leased: no server to start)."""

from __future__ import annotations

from dbwrap_py.bench import handover


def test_both_nodes_get_the_record_and_no_increment_is_lost():
    result = handover.run(a_procs=2, b_procs=1, seconds=1.5, hold_ms=0.2)
    assert not [w.error for w in result.workers if w.error]
    assert {w.node for w in result.workers} == {"a", "b"}
    assert all(w.locks > 0 for w in result.workers), handover.report_lines(result)
    assert result.lost == 0 and result.final == sum(w.locks for w in result.workers)
    assert any("fairness b/a" in line for line in handover.report_lines(result))


def test_a_lost_increment_is_reported():
    result = handover.Result("x", 1, 0, [handover.Worker("a", 5), handover.Worker("b", 3)], final=7)
    assert result.lost == 1 and result.fairness == 0.6
    assert handover.report_lines(result)[-1].startswith("LOST: the record shows 7, 1 increment(s) fewer")
