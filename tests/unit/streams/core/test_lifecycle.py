"""Lifecycle (open -> update -> resolved, stable ids), stats, eviction."""

from __future__ import annotations

import pytest

from stepwatch.contract import EventType
from stepwatch.streams.core import DetectConfig, Engine
from tests.support.detect_synth import T0, Job, drive, event, gpu_message, interleave, opened


def _states(found: list) -> list[tuple[str, str, int | None]]:
    return [(d.type, d.state, d.rank) for d in found]


def test_one_straggler_is_one_detection_from_open_to_resolved() -> None:
    job = Job(world=16, steps=120, slow={7: (30, 1.2)})
    job.single = {(7, s): 1 / 1.2 for s in range(70, 120)}  # it recovers at step 70
    found = drive(Engine(), job.messages())
    assert [s for s in _states(found) if s[1] != "update"] == [
        ("straggler", "open", 7),
        ("straggler", "resolved", 7),
    ]
    assert len({d.id for d in found}) == 1
    resolved = found[-1]
    assert resolved.first_step == found[0].first_step
    assert 70 <= (resolved.step or 0) <= 70 + DetectConfig().resolve_steps + 8
    assert resolved.opened_at == found[0].opened_at
    # every state change has its own identity: inst = the id, seq = the change number
    assert [(d.inst, d.seq) for d in found] == [(resolved.id, i) for i in range(len(found))]


def test_ids_are_stable_across_replays() -> None:
    job = Job(world=16, steps=60, slow={2: (20, 1.2)})
    a = drive(Engine(), job.messages())
    b = drive(Engine(), job.messages())
    assert [d.id for d in a] == [d.id for d in b] and a


def test_updates_are_rate_limited() -> None:
    job = Job(world=16, steps=200, slow={3: (20, 1.1)})
    job.single = {(3, s): 1.5 for s in range(60, 200)}  # the score grows a lot
    found = drive(Engine(DetectConfig(update_min_seconds=30.0)), job.messages())
    updates = [d for d in found if d.state == "update"]
    assert 1 <= len(updates) <= 200 // 30
    assert all(u.score and u.score > 0.3 for u in updates)


def test_job_end_resolves_what_is_open_and_the_job_is_evicted() -> None:
    job = Job(world=16, steps=60, slow={2: (20, 1.2)})
    messages = job.messages()
    end_ts = max(r.end for m in messages for r in m.steps) + 0.5
    end = event(EventType.JOB_END, "h000", end_ts, job_id=job.job_id, code=0, detail="completed")
    engine = Engine(DetectConfig(job_end_grace_seconds=100.0))
    found = drive(engine, [*messages, end], until=end_ts + 10)
    assert _states(found)[-1] == ("straggler", "resolved", 2)
    assert found[-1].evidence["resolved_because"] == "job ended"
    assert [s.job_id for s in engine.stats()] == [job.job_id]
    drive(engine, [], until=end_ts + 101)
    assert engine.stats() == []


def test_stats_throughput_mfu_and_goodput() -> None:
    job = Job(world=16, steps=60, flops=2e14, pauses={10: 5.0})  # before the rate window
    messages = job.messages()
    samples = [gpu_message(h, T0 + k) for k in range(70) for h in job.hosts()]
    engine = Engine()
    drive(engine, interleave(messages, samples))
    (s,) = engine.stats()
    step = 1.0 * (sum((0.01, 0.30, 0.55, 0.06)) + 0.08)  # work + collective, no jitter
    assert s.last_step == 59 and s.world_size == 16 and not s.hung
    assert s.step_seconds_median == pytest.approx(step, rel=0.05)
    assert s.samples_per_second == pytest.approx(16 * 4 / step, rel=0.05)
    assert s.tokens_per_second == pytest.approx(16 * 4096 / step, rel=0.05)
    assert s.mfu == pytest.approx(2e14 / step / 989e12, rel=0.05)
    assert s.badput_seconds["checkpoint"] == pytest.approx(5.0, rel=0.01)
    assert s.badput_seconds["data_loading"] == pytest.approx(0.6, rel=0.1)
    assert 0.8 < (s.goodput_ratio or 0) < 0.95


def test_restart_from_a_checkpoint_counts_lost_progress() -> None:
    import msgspec

    job = Job(world=8, steps=40)
    first = job.messages()
    restart_at = max(r.end for m in first for r in m.steps) + 30.0
    again = Job(world=8, steps=40).messages()[: 10 * 1]  # steps 0..9 again, 30 s later
    shift = restart_at - T0
    again = [
        msgspec.structs.replace(
            m,
            ts=m.ts + shift,
            steps=[
                msgspec.structs.replace(
                    r, start=r.start + shift, end=r.end + shift, step=r.step + 20
                )
                for r in m.steps
            ],
        )
        for m in again
    ]  # resumes from step 20 (the last checkpoint)
    engine = Engine()
    assert drive(engine, [*first, *again]) == []
    (s,) = engine.stats()
    assert s.last_step == 29
    assert s.badput_seconds["restart"] == pytest.approx(30.0, abs=0.5)
    assert s.badput_seconds["wasted_progress"] == pytest.approx(20 * 0.99, rel=0.1)


def test_memory_stays_bounded_and_silent_jobs_are_forgotten() -> None:
    job = Job(world=8, steps=40, slow={1: (10, 1.3)})
    messages = job.messages()
    for m in messages:  # rank 0 never reports: every step waits, the pending steps are capped
        m.steps[:] = [r for r in m.steps if r.rank != 0]
    cfg = DetectConfig(max_pending_steps=8, job_silence_seconds=300.0, hang_min_seconds=1e6)
    engine = Engine(cfg)
    for m in messages:
        engine.process(m)
        assert engine.jobs[job.job_id].assembler.pending_steps <= cfg.max_pending_steps + 1
    found = drive(engine, [], until=engine.now + 301)
    assert engine.stats() == [] and engine.jobs == {}
    assert all(d.state == "resolved" for d in found)


def test_a_job_restarted_with_another_world_size_starts_afresh() -> None:
    import msgspec

    first = Job(world=16, steps=30).messages()
    later = max(r.end for m in first for r in m.steps) + 60
    second = Job(world=8, steps=30).messages()
    second = [
        msgspec.structs.replace(
            m,
            ts=m.ts + later - T0,
            steps=[
                msgspec.structs.replace(r, start=r.start + later - T0, end=r.end + later - T0)
                for r in m.steps
            ],
        )
        for m in second
    ]
    engine = Engine(DetectConfig(hang_min_seconds=1e6))
    drive(engine, [*first, *second])
    (s,) = engine.stats()
    assert s.world_size == 8 and s.last_step == 29


def test_a_restart_resolves_the_runs_straggler_and_its_warm_up_opens_nothing() -> None:
    """A drain + requeue: the straggler's run ends, the job restarts from its checkpoint on
    healthy hosts and warms up (first steps up to 1.8x slower, as caches, compilation and
    data loaders fill again). The run's straggler resolves as restarted; neither the warm-up
    nor the old run's slow window opens a job_slowdown."""
    import msgspec

    engine = Engine()
    first = Job(world=16, steps=90, slow={13: (40, 1.3)}).messages()
    found = drive(engine, first)
    assert [(d.type, d.rank) for d in opened(found)] == [("straggler", 13)]

    def warm(s: int) -> float:  # decays to 1 over ten steps after the restart at step 75
        since = s - 75
        return 1.0 + 0.8 * (1.0 - since / 10) ** 2 if 0 <= since < 10 else 1.0

    shift = max(r.end for m in first for r in m.steps) - T0 + 20.0  # back 20 s later
    again = [
        msgspec.structs.replace(
            m,
            ts=m.ts + shift,
            steps=[
                msgspec.structs.replace(r, start=r.start + shift, end=r.end + shift)
                for r in m.steps
            ],
        )
        for m in Job(world=16, steps=160, job_factor=warm).messages()
        if m.steps[0].step >= 75
    ]
    found = drive(engine, again)
    resolved = [d for d in found if d.state == "resolved"]
    assert [(d.type, d.rank, d.evidence["resolved_because"]) for d in resolved] == [
        ("straggler", 13, "job restarted from a checkpoint")
    ]
    assert opened(found) == []
