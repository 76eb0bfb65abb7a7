"""Batch cutting, and cutting again at the same offsets after a restart."""

from __future__ import annotations

from stepwatch.exporters.clickhouse.planner import Planner
from stepwatch.exporters.clickhouse.prepare import Record

TP = ("t.steps", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rec(offset: int) -> Record:
    return Record(TP[0], TP[1], offset, b"{}")


def bounds(batches):
    return [(b.first, b.last, len(b.records), b.replayed) for b in batches]


def test_cuts_by_size_then_by_age():
    clock = Clock()
    p = Planner(batch_messages=3, batch_seconds=1.0, clock=clock)
    for o in range(7):
        p.add(rec(o))
    assert bounds(p.due()) == [(0, 2, 3, False), (3, 5, 3, False)]
    assert p.due() == [] and p.buffered == 1
    clock.now = 1.5
    assert bounds(p.due()) == [(6, 6, 1, False)]


def test_age_counts_from_the_oldest_buffered_record():
    clock = Clock()
    p = Planner(batch_messages=100, batch_seconds=1.0, clock=clock)
    p.add(rec(0))
    for step in range(1, 10):  # polls keep coming; the batch must still age
        clock.now = step * 0.2
        p.add(rec(step))
        batches = p.due()
        if batches:
            break
    assert bounds(batches) == [(0, 5, 6, False)]


def test_redelivered_offsets_are_ignored():
    p = Planner(batch_messages=2)
    for o in (0, 1, 1, 0, 2, 3):
        p.add(rec(o))
    assert bounds(p.due()) == [(0, 1, 2, False), (2, 3, 2, False)]


def test_plans_are_reproduced_exactly_whatever_the_size_rule_says():
    clock = Clock()
    p = Planner(batch_messages=100, batch_seconds=0.0, clock=clock)
    p.assign(TP, [(10, 12), (13, 19)])
    for o in range(10, 16):
        p.add(rec(o))
    # (10, 12) is complete; (13, 19) must wait for offset 19 even though it is "old"
    assert bounds(p.due(force=True)) == [(10, 12, 3, True)]
    for o in range(16, 25):
        p.add(rec(o))
    assert bounds(p.due()) == [(13, 19, 7, True), (20, 24, 5, False)]
    assert p.pending_plans(TP) == []


def test_plan_bounds_survive_missing_offsets():
    p = Planner(batch_messages=100, batch_seconds=0.0)
    p.assign(TP, [(10, 14)])
    for o in (11, 13, 15, 16):  # compacted or transactional gaps
        p.add(rec(o))
    batches = p.due()
    assert bounds(batches) == [(10, 14, 2, True), (15, 16, 2, False)]


def test_records_before_a_plan_are_cut_before_it():
    p = Planner(batch_messages=100, batch_seconds=60.0)
    p.assign(TP, [(5, 6)])
    for o in range(3, 8):
        p.add(rec(o))
    assert bounds(p.due()) == [(3, 4, 2, False), (5, 6, 2, True)]
    assert p.buffered == 1


def test_revoke_forgets_the_partition():
    p = Planner()
    p.add(rec(0))
    p.revoke(TP)
    assert p.buffered == 0 and p.due(force=True) == []
