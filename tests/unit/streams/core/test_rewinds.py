"""A restart from a checkpoint is what half of a job's ranks say, each by its own history.

Before, one step record did it: a record of an earlier step that started after the
job's last closed step ended (on whichever host's clock ended it last). A late record
from a host whose clock is ahead of its peers', or one forged record, restarted a
healthy job: its open detections resolved ("job restarted from a checkpoint"), its
next ten steps not scored, its goodput charged with a restart.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from stepwatch.contract import Message, StepMessage, StepRecord, decode_unchecked
from stepwatch.contract.records import DetectionMessage
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.core.assembly import START, StepAssembler
from stepwatch.streams.core.rewinds import HOLD_SECONDS
from tests.support.detect_synth import Job, drive

pytestmark = pytest.mark.unit

RUNS = Path(__file__).parents[3] / "fixtures" / "torch"
DELAY = 0.3  # seconds from a host's send to the worker's read


def _load(run: str, ahead: dict[str, float]) -> list[tuple[float, Message]]:
    """The run's messages with their send times; ``ahead``: hosts' clocks off by seconds."""
    out = []
    for line in (RUNS / f"{run}.jsonl").read_text().splitlines():
        m = json.loads(line)
        sent, off = m["ts"], ahead.get(m["host"], 0.0)
        m["ts"] += off
        for s in m.get("steps", []):
            s["start"] += off
            s["end"] += off
        out.append((sent, decode_unchecked(json.dumps(m))))
    return sorted(out, key=lambda x: x[0])


def _feed(msgs: list[tuple[float, Message]]) -> tuple[Engine, list[DetectionMessage]]:
    engine, found, ticked = Engine(DetectConfig()), [], 0.0
    for now, m in msgs:
        found += engine.process(m, now)
        if now - ticked >= 1.0:
            ticked = now
            found += engine.tick(now)
    for k in range(1, 40):
        found += engine.tick(now + k)
    return engine, found


def _partitioned(
    msgs: list[tuple[float, Message]], host: str, at: float, seconds: float
) -> list[tuple[float, Message]]:
    """``host``'s messages sent in [at, at + seconds) arrive when its link comes back."""
    out = []
    for sent, m in msgs:
        cut = m.host == host and at <= sent < at + seconds
        out.append((at + seconds + DELAY if cut else sent + DELAY, m))
    return sorted(out, key=lambda x: x[0])  # stable: a host's own order is kept


def _moved(recs: list[StepRecord], steps: int, seconds: float) -> list[StepRecord]:
    """``recs`` renumbered by ``steps`` and moved ``seconds`` later (a new run's records)."""
    return [
        msgspec.structs.replace(
            r, step=r.step + steps, start=r.start + seconds, end=r.end + seconds
        )
        for r in recs
    ]


def _summary(found: list[DetectionMessage]) -> list[tuple[str, int | None, str, str, str]]:
    return [
        (d.type, d.rank, d.cause, d.state, str(d.evidence.get("resolved_because", "")))
        for d in found
    ]


def test_late_records_of_a_host_whose_clock_is_ahead_are_late_not_a_restart() -> None:
    """Real recorded DDP run (2 hosts of 2 ranks): host-1, whose clock is 30 s ahead,
    loses its link for 8 s; the steps close without its ranks (``rank_missing`` for
    them, rightly), and its records come late. On host-1's clock they start after the
    job's last closed step ended. Before, the first of them restarted the job: 9.7 s of
    progress counted as wasted, and both ranks of the healthy host-0 called missing."""
    msgs = _load("compute", {"host-1": 30.0})
    first, last = msgs[0][0], msgs[-1][0]
    engine, found = _feed(_partitioned(msgs, "host-1", first + 0.6 * (last - first), 8.0))
    stats = engine.stats()[0]
    assert stats.badput_seconds["restart"] == 0.0
    assert stats.badput_seconds["wasted_progress"] == 0.0
    missing = {d.rank for d in found if d.type == "rank_missing" and d.state == "open"}
    assert missing == {2, 3}  # host-1's ranks, not host-0's
    assert not [d for d in found if "restarted" in str(d.evidence.get("resolved_because"))]
    assert engine.jobs[stats.job_id].assembler.late > 0  # counted, not used


def _straggling_job() -> tuple[Engine, list[DetectionMessage], list[StepMessage]]:
    job = Job(world=16, steps=60, slow={5: (20, 1.3)})
    messages = job.messages()
    engine = Engine()
    return engine, drive(engine, messages), messages


def _forged(messages: list[StepMessage], ranks: list[int], step: int) -> StepMessage:
    """Records of ``step`` for ``ranks``, starting 1 s after the job's last record ended."""
    last = max(r.end for m in messages for r in m.steps)
    recs: list[StepRecord] = [
        msgspec.structs.replace(r, start=last + 1.0, end=last + 1.5)
        for m in messages
        for r in m.steps
        if r.step == step and r.rank in ranks
    ]
    return msgspec.structs.replace(messages[-1], steps=recs, ts=last + 1.5)


@pytest.mark.parametrize("ranks", [[0], [0, 1, 2, 3, 4, 5, 6]], ids=["one-rank", "7-of-16"])
def test_forged_records_of_an_old_step_for_fewer_than_half_the_ranks_restart_nothing(
    ranks: list[int],
) -> None:
    engine, found, messages = _straggling_job()
    assert [(d.type, d.rank, d.state) for d in found][:1] == [("straggler", 5, "open")]
    after = engine.process(_forged(messages, ranks, 30))
    after += engine.tick(max(r.end for m in messages for r in m.steps) + 5)
    assert after == []  # the straggler stays open
    job = next(iter(engine.jobs.values()))
    assert job.assembler.last_closed == 59 and engine.stats()[0].badput_seconds["restart"] == 0.0
    assert job.assembler.watch.held  # held, waiting for half the job
    engine.tick(max(r.end for m in messages for r in m.steps) + HOLD_SECONDS + 2)
    assert not job.assembler.watch.held and job.assembler.late >= len(ranks)


def test_half_the_ranks_going_back_is_a_restart() -> None:
    engine, found, messages = _straggling_job()
    assert [(d.type, d.rank, d.state) for d in found][:1] == [("straggler", 5, "open")]
    after = engine.process(_forged(messages, list(range(8)), 30))
    assert [(d.type, d.rank, d.evidence["resolved_because"]) for d in after] == [
        ("straggler", 5, "job restarted from a checkpoint")
    ]


def test_a_rank_whose_old_run_goes_on_did_not_restart() -> None:
    """A rank's record of an earlier step (forged, or a bug) is held; the same rank then
    reports its next step, which started before the held one: its held record is late,
    and other ranks going back later do not count it."""
    job = Job(world=4, steps=12)
    recs = [r for m in job.messages() for r in m.steps]
    asm = StepAssembler(4, deadline=5.0, max_pending=64)
    asm.add([r for r in recs if r.step < 10])
    last = max(r.end for r in recs if r.step < 10)
    forged = msgspec.structs.replace(
        next(r for r in recs if r.rank == 0 and r.step == 3), start=last + 30, end=last + 31
    )
    asm.add([forged])
    assert asm.watch.held and asm.rewinds == []
    closed = asm.add([r for r in recs if r.step == 10])  # rank 0's real step 10
    assert [c.step for c in closed] == [10] and not asm.watch.held and asm.late == 1
    again = msgspec.structs.replace(
        next(r for r in recs if r.rank == 1 and r.step == 3), start=last + 40, end=last + 41
    )
    asm.add([again])  # rank 1 alone: 1 of 4 ranks, not half
    assert asm.rewinds == []


def test_a_real_restart_keeps_every_record_of_the_new_run() -> None:
    """All ranks restart from step 4 after a pause, their records arriving rank by rank:
    the first ranks' records are held until half the job went back, then every record of
    the new run is assembled; the new run's steps close complete, in order."""
    job = Job(world=8, steps=10)
    recs = [r for m in job.messages() for r in m.steps]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add(recs)
    shift = 100.0
    again = _moved(recs[:24], 4, shift)
    closed = [cs for r in again for cs in asm.add([r])]
    assert [(c.step, c.complete) for c in closed] == [(4, True), (5, True), (6, True)]
    (rw,) = asm.rewinds
    assert (rw.from_step, rw.to_step) == (9, 4) and rw.gap_seconds > 80
    assert asm.late == 0 and asm.duplicates == 0


def test_a_restart_of_fast_steps_reported_host_by_host_keeps_every_record() -> None:
    """4 hosts of 2 ranks, 16 steps a host message (0.06 s steps, a 1 Hz agent): the
    first host's message is a quarter of the ranks, 16 steps each, held until the second
    host's comes; nothing of the new run is lost or late."""
    job = Job(world=8, steps=40)
    recs = [r for m in job.messages() for r in m.steps]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add([r for r in recs if r.step < 30])
    again = _moved([r for r in recs if 20 <= r.step < 36], -20, 100)
    closed = []
    for ranks in ((0, 1), (2, 3), (4, 5), (6, 7)):  # one host's message at a time
        closed += asm.add([r for r in again if r.rank in ranks])
    assert [(c.step, c.complete) for c in closed] == [(s, True) for s in range(16)]
    assert asm.late == 0 and len(asm.rewinds) == 1


def test_records_held_for_one_rank_are_bounded() -> None:
    """A forger sends 500 records of old steps for one rank: at most the assembler's
    bound on open steps is held, the rest are late; nothing restarts."""
    job = Job(world=8, steps=10)
    recs = [r for m in job.messages() for r in m.steps]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add(recs)
    last = max(r.end for r in recs)
    base = next(r for r in recs if r.rank == 0 and r.step == 9)
    flood = [
        msgspec.structs.replace(base, step=9, start=last + 1 + i, end=last + 1.5 + i)
        for i in range(500)
    ]
    asm.add(flood)
    assert len(asm.watch.held) == 64 and asm.late == 500 - 64 and asm.rewinds == []


def _shifted(messages: list[StepMessage], shift: float, delay: dict[str, float] | None = None):  # type: ignore[no-untyped-def]
    """The messages' times ``shift`` seconds later; ``delay``: extra seconds for a host's."""
    out = []
    for m in messages:
        late = (delay or {}).get(m.host, 0.0)
        steps = [
            msgspec.structs.replace(r, start=r.start + shift, end=r.end + shift) for r in m.steps
        ]
        out.append(msgspec.structs.replace(m, ts=m.ts + shift + late, steps=steps))
    return sorted(out, key=lambda m: m.ts)


def test_a_restart_during_a_hang_reported_host_by_host_is_one_restart() -> None:
    """4 hosts of 4 ranks: the restart's first message is a quarter of the job (held).
    Before, its records counted as progress: the hang resolved as "progress resumed" and
    the outage was charged twice, as hang and as restart."""
    job = Job(world=16, steps=30, per_host=4)
    first = job.messages()
    engine = Engine()
    stop = max(r.end for m in first for r in m.steps)
    assert [d.type for d in drive(engine, first, until=stop + 70)] == ["hang"]
    again = [m for m in Job(world=16, steps=30, per_host=4).messages() if m.steps[0].step >= 20]
    found = drive(engine, _shifted(again, 120.0))
    assert [(d.type, d.evidence["resolved_because"]) for d in found] == [("hang", "restarted")]
    s = engine.stats()[0]
    assert s.badput_seconds["hang"] == 0.0 and 100 < s.badput_seconds["restart"] < 120


def test_a_forged_record_of_an_old_step_does_not_resolve_a_hang() -> None:
    """Held for a restart half the job never confirms, a forged record is no progress.
    Before, each one resolved the real hang ("progress resumed") for another minute."""
    job = Job(world=16, steps=30)
    msgs = job.messages()
    engine = Engine()
    stop = max(r.end for m in msgs for r in m.steps)
    assert [d.type for d in drive(engine, msgs, until=stop + 70)] == ["hang"]
    base = next(r for m in msgs for r in m.steps if r.rank == 0 and r.step == 25)
    now = stop + 70
    for _ in range(3):
        forged = msgspec.structs.replace(base, start=now - 0.5, end=now)
        out = engine.process(msgspec.structs.replace(msgs[0], steps=[forged], ts=now))
        out += drive(engine, [], until=now + 65)
        assert out == []
        now += 65
    assert engine.stats()[0].hung


def test_a_hosts_late_first_records_after_a_restart_are_not_a_second_restart() -> None:
    """2 hosts of 8 restart from step 20; h001's first messages of the new run come 8 s
    late, after the new run's first steps closed without it. Before, the history kept
    from the old run made its ranks "go back" again: a second restart, the outage
    charged twice, every rank of both hosts called missing."""
    job = Job(world=16, steps=30, per_host=8)
    engine = Engine()
    old = job.messages()
    drive(engine, old, until=max(r.end for m in old for r in m.steps) + 20)
    new = [m for m in Job(world=16, steps=50, per_host=8).messages() if m.steps[0].step >= 20]
    delayed = [m for m in new if m.host == "h001" and m.steps[0].step < 28]
    moved = _shifted(delayed, 120.0, {"h001": 8.0})
    found = drive(
        engine,
        sorted(_shifted([m for m in new if m not in delayed], 120.0) + moved, key=lambda m: m.ts),
    )
    s = engine.stats()[0]
    assert 100 < s.badput_seconds["restart"] < 120
    assert s.badput_seconds["wasted_progress"] == pytest.approx(10, abs=0.1)
    missing = {d.rank for d in found if d.type == "rank_missing" and d.state == "open"}
    assert missing <= set(range(8, 16))  # h001's late ranks at most, never h000's


def test_one_forged_record_of_a_step_far_ahead_neither_restarts_nor_blinds_the_job() -> None:
    """The gate admits a step up to 1000 beyond the job's highest: one record of rank 0
    at step +500 closed on its deadline as soon as no real step was open. Then every real
    record was late (the job blind) or, before the rewind quorum, a restart that resolved
    the real straggler. It is a stray step now: its one record is late."""
    job = Job(world=16, steps=90, slow={5: (20, 1.3)})
    msgs = job.messages()
    engine, found, now = Engine(), [], msgs[0].ts
    base = next(r for m in msgs for r in m.steps if r.rank == 0 and r.step == 59)
    forged = msgspec.structs.replace(msgs[0], steps=[msgspec.structs.replace(base, step=559)])
    ordered = sorted(
        [*msgs, msgspec.structs.replace(forged, ts=base.end + 0.2)], key=lambda m: m.ts
    )
    for m in ordered:
        while now + 0.5 <= m.ts:  # the worker's ticks
            now += 0.5
            found += engine.tick(now)
        found += engine.process(m, m.ts)
    assert [(d.type, d.rank, d.state) for d in found] == [("straggler", 5, "open")]
    job_ = engine.jobs[job.job_id]
    assert job_.assembler.late == 1 and job_.assembler.last_closed == 89
    assert engine.stats()[0].badput_seconds["wasted_progress"] == 0.0


def test_an_old_runs_records_delayed_past_a_restart_stay_out_of_the_new_run() -> None:
    """Ranks 0 and 1 (one host) reported steps 0-24 of the old run; its records of steps
    25-29 were held up (a link down) and arrive after the job restarted from step 20,
    100 s later. They belong to no step of the new run; the new run's own records of
    ranks 0 and 1 for steps 25-29 are real. Before, the old ones filled those steps
    (their start 100 s before their peers') and the real ones were dropped as
    duplicates (10 and 10)."""
    job = Job(world=8, steps=40)
    recs = [r for m in job.messages() for r in m.steps]
    delayed = [r for r in recs if 25 <= r.step < 30 and r.rank in (0, 1)]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add([r for r in recs if r.step < 30 and r not in delayed])
    again = _moved([r for r in recs if r.step >= 20], 0, 100)
    closed = asm.add([r for r in again if r.step < 24]) + asm.add(delayed)
    closed += asm.add([r for r in again if r.step >= 24])
    new_run = {(r.step, r.rank): r.start for r in again}
    old = [(c.step, k) for c in closed for k in range(8) if c.m[START, k] != new_run[(c.step, k)]]
    assert len(asm.rewinds) == 1
    assert (old, asm.duplicates) == ([], 0)


def test_a_host_cut_off_for_the_old_runs_last_minute_keeps_it_out_of_the_new_run() -> None:
    """Ranks 0 and 1's host lost its link at step 25; the job went on without them to
    step 84, died, and restarted from step 60 30 s later. Their spool then sends the old
    run's steps 25-84 and the new run's 60-79: the new run's steps hold only its own
    records, every one of them (the old records' starts reach 1 s before the restart,
    past the end of the last step those ranks reported by 60 s)."""
    job = Job(world=8, steps=100)
    recs = [r for m in job.messages() for r in m.steps]
    cut = [r for r in recs if 25 <= r.step < 85 and r.rank in (0, 1)]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    for s in range(85):
        asm.add([r for r in recs if r.step == s and r not in cut])
        asm.expire(max(r.end for r in recs if r.step == s) + 5.1)
    assert asm.last_closed == 84 and asm.absent == {0, 1}
    end84 = max(r.end for r in recs if r.step == 84)
    shift = end84 + 30 - min(r.start for r in recs if r.step == 25)
    again = _moved([r for r in recs if 25 <= r.step < 45], 35, shift)
    new_run = {(r.step, r.rank): r.start for r in again}
    closed = asm.add([r for r in again if r.rank >= 2 and r.step < 70])
    closed += asm.add(cut) + asm.add([r for r in again if r.rank < 2])
    closed += asm.add([r for r in again if r.rank >= 2 and r.step >= 70])
    assert [rw.to_step for rw in asm.rewinds] == [60]
    assert [(c.step, c.complete) for c in closed] == [(s, True) for s in range(60, 80)]
    old = [(c.step, k) for c in closed for k in range(8) if c.m[START, k] != new_run[(c.step, k)]]
    assert (old, asm.duplicates) == ([], 0)


@pytest.mark.parametrize("off", [-30.0, 30.0])
def test_a_restart_keeps_the_new_run_of_a_host_whose_clock_is_off(off: float) -> None:
    """Ranks 6 and 7's host clock is ``off`` seconds from its peers' and its records of
    the new run come last: each rank is judged on its own clock, so none of them is
    taken for the old run's."""
    job = Job(world=8, steps=40)
    recs = [
        msgspec.structs.replace(r, start=r.start + off, end=r.end + off) if r.rank >= 6 else r
        for m in job.messages()
        for r in m.steps
    ]
    asm = StepAssembler(8, deadline=5.0, max_pending=64)
    asm.add([r for r in recs if r.step < 30])
    again = _moved([r for r in recs if 30 <= r.step < 40], -10, 20)
    closed = asm.add([r for r in again if r.rank < 6]) + asm.add([r for r in again if r.rank >= 6])
    assert [(c.step, c.complete) for c in closed] == [(s, True) for s in range(20, 30)]
    assert (asm.late, asm.duplicates, len(asm.rewinds)) == (0, 0, 1)


def test_a_restart_resolves_at_the_new_runs_start_not_after_the_old_runs_tail() -> None:
    """The old run's last steps were reported by half its ranks only (the job was killed
    mid-step, as a requeue does) and the new run starts 20 s later: the straggler it
    resolves is stamped when the new run began. Before, the old run's newest end plus the
    gap from its last *closed* step counted that tail twice (3.8 s here; 14 s in the
    demo, after the alert had resolved)."""
    job = Job(world=16, steps=60, slow={5: (20, 1.3)})
    messages = job.messages()
    killed = [
        msgspec.structs.replace(m, steps=[r for r in m.steps if r.step < 57 or r.rank < 8])
        for m in messages
    ]
    engine = Engine()
    assert [(d.type, d.rank, d.state) for d in drive(engine, killed)][:1] == [
        ("straggler", 5, "open")
    ]
    last = max(r.end for m in killed for r in m.steps)
    step30 = [r for m in messages for r in m.steps if r.step == 30]
    began = last + 20.0
    new = _moved(step30, 0, began - min(r.start for r in step30))
    after = engine.process(
        msgspec.structs.replace(messages[-1], steps=new, ts=max(r.end for r in new))
    )
    assert [(d.type, d.rank, d.evidence["resolved_because"]) for d in after] == [
        ("straggler", 5, "job restarted from a checkpoint")
    ]
    assert after[0].ts == pytest.approx(began, abs=0.01)
