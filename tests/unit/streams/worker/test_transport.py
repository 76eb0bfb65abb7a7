"""Event-time alignment of fetched records across the co-partitioned topics."""

from __future__ import annotations

from dataclasses import dataclass

from stepwatch.streams.worker.transport import EventTimeAligner


@dataclass
class R:
    offset: int
    timestamp: int


@dataclass
class App:
    consumer_generation_id: int = 1


def recs(*stamps: int) -> list[R]:
    return [R(i, ts) for i, ts in enumerate(stamps)]


def order(items: object) -> list[tuple[str, int]]:
    return [(tp, r.timestamp) for tp, r in items]  # type: ignore[attr-defined]


def test_merges_by_timestamp_and_holds_back_what_runs_ahead() -> None:
    al = EventTimeAligner(App())
    # steps fetched up to t=100, gpu only up to t=40: steps after 40 wait
    out = order(al.iterate({"steps": recs(10, 30, 50, 100), "gpu": recs(20, 40)}))
    assert out == [("steps", 10), ("gpu", 20), ("steps", 30), ("gpu", 40)]
    assert [r.timestamp for r in al.held["steps"]] == [50, 100]
    out = order(al.iterate({"gpu": recs(60, 110)}))
    assert out == [("steps", 50), ("gpu", 60), ("steps", 100)]
    assert [r.timestamp for r in al.held["gpu"]] == [110]
    assert order(al.iterate({})) == [("gpu", 110)]  # nothing new: release everything
    assert not al.held


def test_partition_order_is_kept_even_with_skewed_timestamps() -> None:
    al = EventTimeAligner(App())
    out = order(al.iterate({"a": recs(10, 5, 30), "b": recs(20)}))
    assert out == [("a", 10), ("a", 5), ("b", 20)]  # suffix from the first newer record held
    assert [r.offset for r in al.held["a"]] == [2]


def test_rebalance_drops_held_records_and_cap_releases_all() -> None:
    app = App()
    al = EventTimeAligner(app)
    al.iterate({"a": recs(10, 50), "b": recs(20)})
    assert al.held
    app.consumer_generation_id = 2
    assert order(al.iterate({"b": recs(30)})) == [("b", 30)]
    capped = EventTimeAligner(App(), max_held=3)
    out = order(capped.iterate({"a": recs(1, 2, 3), "b": recs(0)}))
    assert out == [("b", 0), ("a", 1), ("a", 2), ("a", 3)] and not capped.held


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int = 0


def test_a_lagging_partition_holds_the_others_back_for_a_few_rounds() -> None:
    steps, gpu, other = TP("steps"), TP("gpu"), TP("changelog")
    lag: list[TP] = [gpu]
    al = EventTimeAligner(App(), frozenset({"steps", "gpu"}), lambda: lag, max_rounds=2)
    # gpu has unread records but none in this fetch, and nothing delivered yet: all wait
    out = order(al.iterate({steps: recs(10, 20), other: recs(99)}))
    assert out == [(other, 99)]  # not an aligned topic: passes straight through
    out = order(al.iterate({gpu: recs(15)}))
    assert out == [(steps, 10), (gpu, 15)]  # steps at 20 > gpu's front 15: still held
    lag.clear()
    assert order(al.iterate({})) == [(steps, 20)]


def test_held_records_are_released_after_max_rounds() -> None:
    steps, gpu = TP("steps"), TP("gpu")
    al = EventTimeAligner(App(), frozenset({"steps", "gpu"}), lambda: [gpu], max_rounds=2)
    assert order(al.iterate({steps: recs(10)})) == []
    assert order(al.iterate({steps: recs(11)})) == []
    assert order(al.iterate({steps: recs(12)})) == [(steps, 10), (steps, 11), (steps, 12)]


def test_only_a_partition_numbers_own_topics_are_aligned() -> None:
    """Jobs on partitions 0 and 1 from hosts 4 minutes apart: before, partition 1's job
    (ahead) was held back behind partition 0's (behind) on every fetch, and looked hung
    while it ran (found by the live test of clocks once jobs were placed by murmur2)."""
    behind, ahead, ahead_gpu = TP("steps", 0), TP("steps", 1), TP("gpu", 1)
    al = EventTimeAligner(App(), frozenset({"steps", "gpu"}), lambda: [], max_rounds=99)
    out = order(al.iterate({behind: recs(100, 101), ahead: recs(340, 341)}))
    assert out == [(behind, 100), (behind, 101), (ahead, 340), (ahead, 341)]
    assert not al.held
    # within one number the topics still wait for each other
    out = order(al.iterate({ahead: recs(342, 350), ahead_gpu: recs(343), behind: recs(102)}))
    assert out == [(behind, 102), (ahead, 342), (ahead_gpu, 343)]
    assert [r.timestamp for r in al.held[ahead]] == [350]
