"""The open-detections ledger: what a restarted worker does with inherited detections."""

from __future__ import annotations

import msgspec

from stepwatch.contract import DetectionMessage, EventMessage, EventType, StepMessage, StepRecord
from stepwatch.streams.worker.ledger import DictStore, Ledger, LedgerEntry

T0 = 1_700_000_000.0


def det(
    id_: str,
    state: str = "open",
    type_: str = "straggler",
    rank: int | None = 5,
    step: int = 40,
    job: str = "j",
) -> DetectionMessage:
    return DetectionMessage(
        host="w",
        ts=T0 + step,
        id=id_,
        job_id=job,
        type=type_,
        state=state,
        rank=rank,
        step=step,
        first_step=step,
        opened_at=T0 + step,
        cause="gpu",
        summary="slow",
    )


def progress(step: int, job: str = "j") -> StepMessage:
    rec = StepRecord(
        job_id=job, rank=0, world_size=8, step=step, start=T0 + step, end=T0 + step + 1
    )
    return StepMessage(host="h", ts=T0 + step, job_id=job, steps=[rec])


class RecordingStore(DictStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bytes, int]] = []

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        super().put(key, value, partition)
        self.writes.append(("put", key, partition))

    def delete(self, key: bytes, partition: int) -> None:
        super().delete(key, partition)
        self.writes.append(("delete", key, partition))


def test_records_open_update_resolved_in_the_store_with_partitions() -> None:
    store = RecordingStore()
    ledger = Ledger(store)
    part = ledger.for_partition(3)
    part.record(det("a"))
    assert msgspec.json.decode(store.data[b"a"], type=LedgerEntry).partition == 3
    part.record(det("a", state="update"))
    assert part.open["a"].state == "update"
    part.record(det("a", state="resolved"))
    assert b"a" not in store and not part.open
    # every write goes to the job's partition
    assert store.writes == [("put", b"a", 3), ("put", b"a", 3), ("delete", b"a", 3)]


def test_restarted_worker_continues_an_inherited_detection_under_its_id() -> None:
    ledger = Ledger()
    ledger.for_partition(1).record(det("old-id", step=40))
    ledger.for_partition(2).record(det("other", job="k"))
    fresh = ledger.for_partition(1)  # a new owner of partition 1
    assert set(fresh.open) == {"old-id"}  # partition 2's entry is not ours
    # the fresh core finds the same straggler again, under its own id
    out = fresh.record(det("new-id", step=60))
    assert (out.id, out.state, out.first_step, out.opened_at) == ("old-id", "update", 40, T0 + 40)
    assert fresh.record(det("new-id", state="update", step=70)).id == "old-id"
    resolved = fresh.record(det("new-id", state="resolved", step=80))
    assert (resolved.id, resolved.state) == ("old-id", "resolved")
    assert b"old-id" not in ledger.store


def test_unconfirmed_inherited_detection_is_resolved_after_grace_steps() -> None:
    ledger = Ledger(grace_steps=10)
    ledger.for_partition(0).record(det("a", step=40))
    fresh = ledger.for_partition(0)
    assert fresh.observe(progress(41), T0) == []
    assert fresh.observe(progress(50), T0) == []
    out = fresh.observe(progress(51), T0 + 51)
    assert [(d.id, d.state) for d in out] == [("a", "resolved")]
    assert "not confirmed" in out[0].summary
    assert not fresh.open and b"a" not in ledger.store
    assert fresh.observe(progress(90), T0) == []  # nothing left to watch


def test_inherited_hang_resolves_as_soon_as_the_job_progresses() -> None:
    ledger = Ledger()
    ledger.for_partition(0).record(det("h", type_="hang", rank=None, step=40))
    fresh = ledger.for_partition(0)
    assert fresh.observe(progress(39), T0) == []  # replayed records from before the hang
    assert [d.state for d in fresh.observe(progress(41), T0)] == ["resolved"]


def test_job_end_and_silence_resolve_inherited_detections() -> None:
    ledger = Ledger()
    part = ledger.for_partition(0)
    part.record(det("a", job="j"))
    part.record(det("b", job="k", step=10))
    fresh = ledger.for_partition(0)
    end = EventMessage(host="h", ts=T0 + 100, type=EventType.JOB_END, job_id="j")
    assert [d.id for d in fresh.observe(end, T0 + 100)] == ["a"]
    assert fresh.expire_silent(T0 + 100, 3600) == []
    assert [d.id for d in fresh.expire_silent(T0 + 10 + 3600, 3600)] == ["b"]
    assert not list(ledger.store.values())


def test_a_new_detection_of_the_fresh_core_is_stored_as_is() -> None:
    ledger = Ledger()
    ledger.for_partition(0).record(det("a", rank=5))
    fresh = ledger.for_partition(0)
    out = fresh.record(det("b", rank=6))  # another rank: not the inherited incident
    assert (out.id, out.state) == ("b", "open")
    assert set(fresh.open) == {"a", "b"}


def test_every_change_after_a_takeover_keeps_the_original_opened_at_and_first_step() -> None:
    ledger = Ledger()
    first = ledger.for_partition(1).record(det("old-id", step=40))
    fresh = ledger.for_partition(1)
    outs = [
        fresh.record(det("new-id", step=60)),
        fresh.record(det("new-id", state="update", step=70)),
        fresh.record(det("new-id", state="resolved", step=80)),
    ]
    assert [(o.opened_at, o.first_step) for o in outs] == [(T0 + 40, 40)] * 3
    # one identity per state change: inst = detection id, seq counts on over the takeover
    assert [(o.inst, o.seq) for o in [first, *outs]] == [("old-id", i) for i in range(4)]


def test_changes_carry_the_detection_id_and_a_gapless_change_number() -> None:
    part = Ledger().for_partition(0)
    outs = [
        part.record(det("a", step=1)),
        part.record(det("b", rank=6, step=1)),
        part.record(det("a", state="update")),
        part.record(det("a", state="resolved")),
        part.record(det("b", rank=6, state="resolved")),
    ]
    assert [(o.inst, o.seq) for o in outs] == [("a", 0), ("b", 0), ("a", 1), ("a", 2), ("b", 1)]


def test_a_ledger_resolution_of_an_inherited_entry_is_the_next_change() -> None:
    ledger = Ledger()
    ledger.for_partition(0).record(det("x", step=40))
    fresh = ledger.for_partition(0)
    out = fresh.observe(
        EventMessage(host="h", ts=T0 + 90, type=EventType.JOB_END, job_id="j"), T0 + 90
    )
    assert [(o.id, o.state, o.inst, o.seq) for o in out] == [("x", "resolved", "x", 1)]
