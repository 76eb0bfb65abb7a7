"""Duplicate and out-of-order filtering in front of the detection core."""

from __future__ import annotations

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    PortMessage,
    StepMessage,
    StepRecord,
)
from stepwatch.streams.worker.dedup import Deduplicator, DropReason, SeenWindow

T0 = 1_700_000_000.0


def steps(job: str, pairs: list[tuple[int, int]]) -> StepMessage:
    records = [
        StepRecord(job_id=job, rank=r, world_size=8, step=s, start=T0 + s, end=T0 + s + 1)
        for r, s in pairs
    ]
    return StepMessage(host="h1", ts=T0, job_id=job, steps=records)


def test_seen_window_new_duplicate_out_of_order_and_stale() -> None:
    w = SeenWindow(8)
    assert w.admit("k", 10) is None
    assert w.admit("k", 10) == DropReason.DUPLICATE
    assert w.admit("k", 7) is None  # late but new: kept
    assert w.admit("k", 7) == DropReason.DUPLICATE
    assert w.admit("k", 2) == DropReason.STALE  # 8 or more behind the high-water mark
    assert w.admit("k", 20) is None
    assert w.admit("k", 10) == DropReason.STALE
    assert w.admit("k", 19) is None and w.admit("k", 19) == DropReason.DUPLICATE


def test_a_jump_far_beyond_the_window_keeps_only_the_new_number() -> None:
    """Shifting the bitmap by the jump built a 2^62-bit number: a MemoryError out of the
    worker's batch (a step of 2^62 after 0 is a valid step number)."""
    w = SeenWindow(8)
    assert w.admit("k", 0) is None
    assert w.admit("k", 2**62) is None
    assert w.admit("k", 2**62 - 3) is None  # late but within the window: kept
    assert w.admit("k", 2**62) == DropReason.DUPLICATE
    assert w.admit("k", 2**62 - 3) == DropReason.DUPLICATE
    assert w.admit("k", 0) == DropReason.STALE


def test_duplicate_step_records_are_removed_and_counted() -> None:
    d = Deduplicator()
    first = steps("j", [(0, 1), (1, 1)])
    assert d.admit(first) is first  # nothing dropped: the same object, no copy
    mixed = d.admit(steps("j", [(0, 1), (2, 1), (1, 2)]))
    assert isinstance(mixed, StepMessage)
    assert [(r.rank, r.step) for r in mixed.steps] == [(2, 1), (1, 2)]
    assert d.admit(steps("j", [(0, 1), (1, 1)])) is None
    assert d.take_dropped() == {("step", DropReason.DUPLICATE): 3}
    assert d.take_dropped() == {}


def test_jobs_are_separate_and_bounded() -> None:
    d = Deduplicator(max_jobs=2)
    for job in ("a", "b", "c"):
        assert d.admit(steps(job, [(0, 5)])) is not None
    assert len(d._jobs) == 2  # "a" evicted, memory bounded
    assert d.admit(steps("c", [(0, 5)])) is None
    assert d.admit(steps("a", [(0, 5)])) is not None  # forgotten: admitted again


def test_host_samples_must_move_forward_in_time() -> None:
    d = Deduplicator()
    gpu = GpuMessage(host="h1", ts=T0 + 2, gpus=[GpuReading(index=0)])
    assert d.admit(gpu) is gpu
    assert d.admit(gpu) is None
    assert d.admit(GpuMessage(host="h1", ts=T0 + 1, gpus=[])) is None
    assert d.admit(GpuMessage(host="h2", ts=T0 + 1, gpus=[])) is not None
    port = PortMessage(host="h1", ts=T0 + 1, ports=[])
    assert d.admit(port) is port  # ports of a host are ordered apart from its GPUs
    assert d.take_dropped() == {
        ("gpu", DropReason.DUPLICATE): 1,
        ("gpu", DropReason.OUT_OF_ORDER): 1,
    }


def test_events_deduplicated_by_sender_sequence() -> None:
    d = Deduplicator()
    ev = EventMessage(host="h1", ts=T0, inst="abc", seq=4, type=EventType.XID, code=79)
    assert d.admit(ev) is ev
    assert d.admit(ev) is None
    unstamped = EventMessage(host="h1", ts=T0, type=EventType.XID, code=79)
    assert d.admit(unstamped) is unstamped and d.admit(unstamped) is unstamped


def test_a_forged_huge_event_seq_does_not_hide_the_senders_real_events() -> None:
    d = Deduplicator()
    forged = EventMessage(host="h1", ts=T0, inst="abc", seq=10**9, type=EventType.XID, code=79)
    assert d.admit(forged) is forged
    real = EventMessage(host="h1", ts=T0, inst="abc", seq=5, type=EventType.XID, code=48)
    assert d.admit(real) is real
