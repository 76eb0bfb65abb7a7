"""Step assembly: duplicates, out-of-order records, deadlines, rewinds; the step arrays."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from stepwatch.contract import Phases, StepMessage, StepRecord
from stepwatch.streams.core import Engine
from stepwatch.streams.core.assembly import (
    BUSY,
    COMPUTE,
    PAUSE,
    XFER,
    Columns,
    StepAssembler,
    build_step,
)
from tests.support.detect_synth import Job, drive


def _records(job: Job) -> list:
    return [r for m in job.messages() for r in m.steps]


def test_duplicates_and_out_of_order_records_give_the_same_steps() -> None:
    records = _records(Job(world=8, steps=12))
    ordered = StepAssembler(8, deadline=5.0, max_pending=64)
    closed = [cs for r in records for cs in ordered.add([r])]
    rng = np.random.default_rng(1)
    shuffled = list(records) + [records[i] for i in rng.integers(len(records), size=30)]
    shuffled = [shuffled[i] for i in rng.permutation(len(shuffled))]
    messy = StepAssembler(8, deadline=5.0, max_pending=64)
    closed2 = [cs for i in range(0, len(shuffled), 5) for cs in messy.add(shuffled[i : i + 5])]
    assert [c.step for c in closed] == list(range(12))
    assert [c.step for c in closed2] == list(range(12))  # in order, none twice
    assert messy.duplicates + messy.late == 30
    for a, b in zip(closed, closed2, strict=True):
        assert np.array_equal(a.m, b.m, equal_nan=True)


def test_deadline_closes_a_step_with_a_missing_rank() -> None:
    records = [r for r in _records(Job(world=8, steps=3)) if not (r.rank == 6 and r.step == 1)]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    out = asm.add(records)
    assert [c.step for c in out] == [0]  # step 1 waits for rank 6, step 2 waits behind it
    end1 = max(r.end for r in records if r.step == 1)
    assert asm.expire(end1 + 4.9) == []
    out = asm.expire(end1 + 5.0)
    assert [(c.step, c.complete) for c in out] == [(1, False), (2, True)]
    assert out[0].missing() == [6] and np.isnan(out[0].m[BUSY, 6])


def test_late_record_after_its_step_closed_is_counted_not_used() -> None:
    records = _records(Job(world=8, steps=4))
    late = next(r for r in records if r.rank == 2 and r.step == 1)
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add([r for r in records if r is not late and r.step <= 1])
    asm.expire(late.end + 6)
    asm.add([late])
    assert asm.late == 1 and asm.rewinds == []


def test_step_number_going_back_after_a_pause_is_a_rewind() -> None:
    records = _records(Job(world=8, steps=10))
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add(records)
    shift = 100.0
    again = [
        msgspec.structs.replace(r, step=r.step + 4, start=r.start + shift, end=r.end + shift)
        for r in records[:16]
    ]
    out = asm.add(again)
    assert [c.step for c in out] == [4, 5]
    (rw,) = asm.rewinds
    assert (rw.from_step, rw.to_step) == (9, 4) and rw.gap_seconds > 80


def test_step_arrays_split_extra_sections() -> None:
    job = Job(world=4, steps=1)
    recs = _records(job)
    ph = Phases(
        data=0.1,
        forward=0.3,
        backward=0.5,
        optimizer=0.05,
        comm_wait=0.02,
        checkpoint=1.0,
        extra={"eval": 2.0, "comm_transfer": 0.2, "loss_scale": 0.01},
    )
    recs[1] = msgspec.structs.replace(recs[1], phases=ph)
    cs = build_step(0, 4, recs)
    assert cs.m[COMPUTE, 1] == pytest.approx(0.86)
    assert cs.m[XFER, 1] == pytest.approx(0.2)
    assert cs.m[PAUSE, 1] == pytest.approx(3.0)
    assert cs.m[BUSY, 1] == pytest.approx(0.1 + 0.86 + 0.2)


def test_engine_tolerates_duplicate_and_reordered_messages() -> None:
    job = Job(world=16, steps=60, slow={5: (20, 1.2)})
    messages = job.messages()
    clean = drive(Engine(), messages)
    rng = np.random.default_rng(3)
    noisy: list[StepMessage] = []
    for i in range(0, len(messages), 6):  # swap within small windows, resend some
        chunk = messages[i : i + 6]
        noisy += [chunk[j] for j in rng.permutation(len(chunk))]
        noisy += [chunk[0]] if rng.random() < 0.5 else []
    engine = Engine()
    messy = drive(engine, noisy)
    assert [(d.type, d.state, d.rank, d.id) for d in messy] == [
        (d.type, d.state, d.rank, d.id) for d in clean
    ]
    assert engine.health()["duplicates"] + engine.health()["late"] > 0


def _record_by_record(records: list[StepRecord]) -> Columns:
    """The columns read record by record: the reference for build_step's column reading."""
    has_phases = has_extra = False
    raw = []
    rank_list = []
    samples = tokens = 0
    flops = 0.0
    has_flops = False
    nonfinite: list[int] = []
    for r in records:
        p = r.phases
        if p is None:
            p = Phases()
        else:
            has_phases = True
            if p.extra:
                has_extra = True
        raw.append(
            (
                r.start,
                r.end,
                p.data,
                p.forward,
                p.backward,
                p.optimizer,
                p.comm_wait,
                p.checkpoint,
                r.cpu_wait,
                r.cpu_time,
            )
        )
        rank_list.append(r.rank)
        samples += r.samples
        tokens += r.tokens
        if r.flops is not None:
            flops += r.flops  # the same sum as sum() over these values
            has_flops = True
        if r.loss_nonfinite:
            nonfinite.append(r.rank)
    return (
        np.array(raw, dtype=float).T,
        rank_list,
        has_phases,
        has_extra,
        samples,
        tokens,
        flops if has_flops else None,
        nonfinite,
    )


def test_the_column_reading_of_records_matches_the_record_by_record_one() -> None:
    from stepwatch.streams.core.assembly import _columns

    rng = np.random.default_rng(5)
    records = _records(Job(world=16, steps=1))
    varied = []
    for i, r in enumerate(records):
        phases = msgspec.structs.replace(
            r.phases,
            checkpoint=0.5 if i == 3 else None,
            comm_wait=None if i == 5 else 0.01,
            extra={"eval": 0.2} if i == 7 else {},
        )
        varied.append(
            msgspec.structs.replace(
                r,
                phases=phases,
                cpu_wait=None if i == 2 else float(rng.random()),
                flops=None if i % 4 == 0 else float(rng.random()) * 1e12,
                loss_nonfinite=i == 9,
                samples=i,
                tokens=3 * i,
            )
        )
    no_phases = [msgspec.structs.replace(r, phases=None) for r in varied]
    mixed = [r if i % 3 else msgspec.structs.replace(r, phases=None) for i, r in enumerate(varied)]
    # every time given (packed as is), the CPU times absent from every record (packed
    # around), absent here and there (value by value)
    timed = [
        msgspec.structs.replace(r, cpu_wait=0.01 * i, cpu_time=0.2) for i, r in enumerate(records)
    ]
    untimed = [msgspec.structs.replace(r, cpu_wait=None, cpu_time=None) for r in timed]
    for recs in (records, varied, no_phases, mixed, timed, untimed):
        a = _columns(recs)
        b = _record_by_record(recs)
        assert np.array_equal(a[0], b[0], equal_nan=True)
        assert a[1:] == b[1:]
    whole = build_step(0, 16, varied)
    assert whole.nonfinite_ranks == (9,) and whole.present.all()


def test_the_ranks_of_a_host_follow_a_rank_that_moves() -> None:
    from stepwatch.streams.core.ranks import RankTable

    records = _records(Job(world=8, steps=1))
    table = RankTable(8)
    table.observe(records)
    host = records[0].host
    before = table.ranks_on(host)
    assert before == [i for i, h in enumerate(table.host) if h == host]
    moved = msgspec.structs.replace(records[-1], host=host)
    table.observe([moved])
    assert table.ranks_on(host) == sorted({*before, moved.rank})


def _closed_view(out: list) -> list[tuple]:
    return [(c.step, [id(r) for r in c.records], c.m.tobytes(), c.complete) for c in out]


def _state_view(asm: StepAssembler) -> tuple:
    pending = {s: (sorted(p.ranks), [id(r) for r in p.records], p.max_end, p.arrived)
               for s, p in asm._pending.items()}  # fmt: skip
    return (asm.late, asm.duplicates, asm.newest_end, asm.last_closed, sorted(asm.absent),
            asm.rewinds, pending)  # fmt: skip


def test_a_whole_message_is_taken_exactly_as_record_by_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path (a message of one open step: _add_whole) against the record-by-record
    loop alone: messages of one host's ranks, some split, merged or repeated; a rank that
    misses steps; a restart two steps back whose first ranks send a step past the last
    closed one before half the job went back (held); the old run's records delivered
    after the restart (late)."""
    rng = np.random.default_rng(7)

    def jittered(records: list[StepRecord], shift: float = 0.0) -> list[StepRecord]:
        return [
            msgspec.structs.replace(
                r, start=r.start + shift, end=r.end + shift + float(rng.uniform(0, 0.2))
            )
            for r in records
        ]

    old = [
        r
        for r in jittered(_records(Job(world=16, steps=30)))
        if not (r.rank == 5 and 12 <= r.step < 15)
    ]
    stragglers = [r for r in old if r.step >= 28 and r.rank >= 12]
    new = [r for r in jittered(_records(Job(world=16, steps=46, seed=1)), 500.0) if r.step >= 27]
    early = [r for r in new if r.rank < 4 and r.step <= 30]
    chunks = [[r for r in old[i : i + 8] if r not in stragglers] for i in range(0, len(old), 8)]
    chunks += [[r for r in early if r.step == s] for s in range(27, 31)]
    after = len(chunks) + 1  # half the job went back: the old run's records come late
    rest = [r for r in new if r not in early]
    chunks += [rest[i : i + 8] for i in range(0, len(rest), 8)]
    chunks[after:after] = [[r for r in stragglers if r.step == s] for s in (28, 29)]
    messages: list[list[StepRecord]] = []
    for k, c in enumerate(chunks):
        if k % 9 == 1:
            cut = int(rng.integers(1, len(c)))
            messages += [c[:cut], c[cut:]]
        elif k % 9 == 4:
            messages[-1] = c + messages[-1]  # two hosts' records, of two steps
        elif k % 9 == 6:
            messages.append([*c, c[0]])  # a rank twice
        elif k % 9 == 8:
            messages += [c, c[-1:]]  # a record sent again alone
        else:
            messages.append(c)
    fast = StepAssembler(16, deadline=5.0, max_pending=64)
    slow = StepAssembler(16, deadline=5.0, max_pending=64)
    monkeypatch.setattr(slow, "_add_whole", lambda records, arrived: None)
    taken = []
    add_whole = fast._add_whole

    def spy(records: list[StepRecord], arrived: float | None) -> bool | None:
        taken.append(add_whole(records, arrived))
        return taken[-1]

    monkeypatch.setattr(fast, "_add_whole", spy)
    for k, msg in enumerate(messages):
        arrived = max(r.end for r in msg) + 0.5 if k % 3 else None
        assert _closed_view(fast.add(msg, arrived)) == _closed_view(slow.add(msg, arrived)), k
        if k % 7 == 0:
            now = max(r.end for r in msg) + 6.0
            assert _closed_view(fast.expire(now)) == _closed_view(slow.expire(now)), k
        assert _state_view(fast) == _state_view(slow), k
    assert fast.rewinds and fast.duplicates and fast.late  # every path was exercised
    assert taken.count(None) > 25 and len(taken) - taken.count(None) > 50, len(taken)
