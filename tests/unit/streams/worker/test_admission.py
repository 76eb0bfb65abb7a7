"""Admission of records against their job's own progress and the worker's clock."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    StepMessage,
    StepRecord,
    Topics,
    encode,
)
from stepwatch.settings import Settings
from stepwatch.streams.worker.admission import AdmissionConfig, Gate, Reason
from stepwatch.streams.worker.app import admission_config, default_engine_factory
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Record, StreamProcessor

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
NOW = T0 + 1000


def msg(
    step: int,
    rank: int = 0,
    start: float | None = None,
    host: str = "h1",
    job: str = "j",
    world: int = 2,
) -> StepMessage:
    s = T0 + step if start is None else start
    return StepMessage(
        host=host,
        ts=s + 1,
        job_id=job,
        steps=[
            StepRecord(job_id=job, rank=rank, world_size=world, step=step, start=s, end=s + 0.9)
        ],
    )


def reasons(gate: Gate, m, now: float = NOW) -> list[Reason]:
    return [r.reason for r in gate.admit(m, now).refusals]


def test_a_huge_step_jump_is_refused_and_moves_nothing() -> None:
    gate = Gate()
    for s in range(50):
        assert reasons(gate, msg(s)) == []
    assert reasons(gate, msg(10**9, start=T0 + 50)) == [Reason.STEP_JUMP]
    assert reasons(gate, msg(50)) == []  # the peak did not move: the next real step is fine


def test_the_allowance_follows_the_cadence_and_the_elapsed_time() -> None:
    cfg = AdmissionConfig(step_jump_min=10, step_jump_factor=2.0)
    gate = Gate(cfg)
    for s in range(0, 100, 10):  # 10 steps a second of event time
        assert reasons(gate, msg(s, start=T0 + s / 10)) == []
    # 100 s later, 2 x 10 steps/s x 100 s = 2000 steps are allowed, not 3000
    assert reasons(gate, msg(90 + 1900, start=T0 + 109)) == []
    assert reasons(gate, msg(1990 + 3000, start=T0 + 110)) == [Reason.STEP_JUMP]


def test_a_first_record_may_start_anywhere_and_a_restart_goes_back() -> None:
    gate = Gate()
    now = NOW + 60_000
    assert reasons(gate, msg(50_000), now) == []  # resumed from a checkpoint
    assert reasons(gate, msg(50_001), now) == []
    back = gate.admit(msg(40_000, start=T0 + 50_002), now)
    assert back.refusals == [] and back.rewound == ["j"]
    late = gate.admit(msg(49_990, start=T0 + 49_990.5), now)  # late, not a restart
    assert late.refusals == [] and late.rewound == []


def test_timestamps_beyond_the_tolerances_are_refused() -> None:
    gate = Gate(AdmissionConfig(future_seconds=120, max_age_seconds=3600))
    assert reasons(gate, GpuMessage(host="h", ts=NOW + 290)) == [Reason.FUTURE]
    assert reasons(gate, GpuMessage(host="h", ts=NOW + 100)) == []
    assert reasons(gate, msg(1, start=NOW + 200)) == [Reason.FUTURE]
    assert reasons(gate, GpuMessage(host="h", ts=NOW - 200 * 86400)) == [Reason.TOO_OLD]
    off = Gate(AdmissionConfig(future_seconds=0, max_age_seconds=0))
    assert reasons(off, GpuMessage(host="h", ts=NOW - 200 * 86400)) == []


def test_job_end_only_from_a_host_that_runs_the_job() -> None:
    gate = Gate()
    gate.admit(msg(1, host="h1"), NOW)
    gate.admit(msg(1, rank=1, host="h2"), NOW)
    end = EventMessage(host="evil", ts=NOW, job_id="j", type=EventType.JOB_END)
    assert reasons(gate, end) == [Reason.FOREIGN_LIFECYCLE]
    unknown = EventMessage(host="evil", ts=NOW, job_id="other", type=EventType.JOB_END)
    assert reasons(gate, unknown) == []  # no step of it yet: nothing to judge against
    real = EventMessage(host="h2", ts=NOW, job_id="j", type=EventType.JOB_END)
    assert reasons(gate, real) == []


def test_one_forged_step_record_does_not_make_a_host_the_jobs() -> None:
    # before: one admitted step record from "evil" made it one of the job's hosts, and its
    # job_end then closed the job's real detections
    gate = Gate()
    for s in range(5):
        assert reasons(gate, msg(s, host="h1")) == []
    assert reasons(gate, msg(5, host="evil")) == []  # admitted: it may be a new host ...
    end = EventMessage(host="evil", ts=NOW, job_id="j", type=EventType.JOB_END)
    assert reasons(gate, end) == [Reason.FOREIGN_LIFECYCLE]  # ... but not the job's yet
    for s in (6, 7):
        assert reasons(gate, msg(s, host="evil")) == []
    assert reasons(gate, end) == []  # records of 3 steps: now one of the job's hosts


def test_jobs_are_bounded() -> None:
    gate = Gate(AdmissionConfig(max_jobs=3))
    for i in range(10):
        gate.admit(msg(1, job=f"j{i}"), NOW)
    assert len(gate) == 3


def test_the_processor_dead_letters_the_jump_and_keeps_the_ranks_real_steps() -> None:
    topics = Topics("t")
    proc = StreamProcessor(
        topics, default_engine_factory(Settings.load(env={})), worker="w", clock=lambda: NOW
    )
    batch = [msg(s, rank=r) for s in range(10) for r in range(2)]
    batch.insert(5, msg(10**9, start=T0 + 3))
    records = [Record(topics.steps, 0, i, b"j", encode(m)) for i, m in enumerate(batch)]
    out = proc.process_batch(records)
    letters = [decode_dead_letter(o.value) for o in out if o.topic == topics.dlq]
    assert [x.reason for x in letters] == ["step_jump"] and letters[0].offset == 5
    assert proc.metrics.dlq.labels("step_jump")._value.get() == 1
    assert dropped(proc) == 0  # no real step of rank 0 dropped as stale
    (stats,) = proc.stats()
    assert stats.last_step >= 8  # the real steps were assembled past the forged one


def test_settings_reach_the_admission_config() -> None:
    cfg = admission_config(
        Settings.load(
            env={"STEPWATCH_STREAM_FUTURE_SECONDS": "30", "STEPWATCH_STREAM_STEP_JUMP_MIN": "50"}
        )
    )
    assert cfg.future_seconds == 30 and cfg.step_jump_min == 50
    assert cfg.max_age_seconds == Settings.load(env={}).stream_max_age_seconds


def test_a_restart_far_back_is_analysed_not_dropped_as_stale() -> None:
    topics = Topics("t")
    proc = StreamProcessor(
        topics, default_engine_factory(Settings.load(env={})), worker="w", clock=lambda: T0 + 2000
    )
    run = [msg(s, rank=r) for s in range(600) for r in range(2)]
    resumed = [msg(s, rank=r, start=T0 + 700 + s) for s in range(100, 200) for r in range(2)]
    records = [Record(topics.steps, 0, i, b"j", encode(m)) for i, m in enumerate(run + resumed)]
    assert proc.process_batch(records) == []
    assert dropped(proc) == 0  # not "stale"
    (stats,) = proc.stats()
    assert 190 <= stats.last_step < 300  # the restarted run is being analysed


def dropped(proc: StreamProcessor) -> float:
    return sum(
        s.value
        for m in proc.metrics.dropped.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_bounds_that_must_be_positive_are_checked() -> None:
    from stepwatch.errors import ConfigError

    for name in (
        "STEPWATCH_STREAM_STEP_JUMP_MIN",
        "STEPWATCH_STORE_DEDUP_MAX_SENDERS",
        "STEPWATCH_STORE_ENDPOINT_MAX_CONCURRENT_QUERIES",
    ):
        with pytest.raises(ConfigError, match="must be >= 1"):
            Settings.load(env={name: "0"})


def _state(gate: Gate) -> list[tuple]:
    return [
        (
            job_id,
            j.first_step,
            j.first_end,
            j.peak,
            j.peak_end,
            j.ceiling,
            j.ceiling_end,
            sorted(j.hosts),
            sorted(j.newcomers.items()),
            j.world,
            j.stepless,
            j.n_seen,
            j.seen is None,
        )
        for job_id, j in gate._jobs.items()
    ] + [
        (gate.capacity.ranks, gate.capacity.hosts, list(gate._hosts.items())),
        (list(gate._unconfirmed), list(gate.evicted), sorted(gate._backing.items())),
        list(gate.evicted_hosts),
    ]


@pytest.mark.parametrize(
    ("max_jobs", "max_ranks", "max_hosts"), [(0, 0, 0), (2, 12, 2), (4096, 0, 0)]
)
def test_check_decides_and_moves_exactly_as_admit(
    max_jobs: int, max_ranks: int, max_hosts: int
) -> None:
    """The worker's hot path (Gate.check) against the reference (Gate.admit), message by message."""
    import random

    rng = random.Random(3)
    cfg = AdmissionConfig(
        step_jump_min=50,
        step_jump_factor=2.0,
        max_jobs=max_jobs,
        max_ranks=max_ranks,
        max_hosts=max_hosts,
        job_idle_seconds=200,
        host_idle_seconds=100,
        max_world_size=8,
        future_seconds=120,
        max_age_seconds=3600,
    )
    ref, fast = Gate(cfg), Gate(cfg)
    passed: list[bool] = []  # the fast path's answers: taken, and declined
    rest_pass = fast._rest_pass

    def spy(*args: Any) -> bool:
        passed.append(rest_pass(*args))
        return passed[-1]

    fast._rest_pass = spy  # type: ignore[method-assign]
    seen: set[Reason] = set()
    step = {"a": 0, "b": 0, "c": 0}
    for i in range(3000):
        job = rng.choice("abc")
        step[job] += rng.choice([0, 1, 1, 1, 2])
        base = step[job]
        recs = []
        for k in range(rng.randint(1, 6)):
            r = rng.random()
            s = base + (10_000 if r < 0.02 else -30 if r < 0.05 else 0)  # jump, back
            j = job if rng.random() > 0.1 else rng.choice("abc")
            start = T0 + base + (0.95 if r < 0.05 else 0) + (5_000 if r > 0.995 else 0)
            world = 4 if rng.random() < 0.97 else rng.choice([9, 6])
            recs.append(
                StepRecord(
                    job_id=j,
                    rank=k % world,
                    world_size=world,
                    step=max(s, 0),
                    start=start,
                    end=start + 0.9,
                )
            )
        host = rng.choice(["h1", "h1", "h2", ""])
        m = StepMessage(host=host, ts=T0 + base + 1, job_id=job, steps=recs)
        if rng.random() < 0.05:
            m = EventMessage(host=host, ts=T0 + base, type=EventType.JOB_END, job_id=job)
        elif rng.random() < 0.05:
            world = rng.choice([4, 6, 9])
            other = rng.choice("abcdef")
            m = EventMessage(
                host=host,
                ts=T0 + base,
                type=EventType.JOB_START,
                job_id=other,
                attrs={"world_size": world},
            )
        elif rng.random() < 0.1:
            m = GpuMessage(
                host=rng.choice(["h1", "h2", "h3", "h4"]),
                ts=T0 + base + rng.choice([0, 0, 200, -5000]),
            )
        now = T0 + base + 60
        want = ref.admit(m, now)
        seen.update(r.reason for r in want.refusals)
        got = fast.check(m, now)
        if got is None:
            assert not want.refusals and not want.rewound and want.message is m, i
        else:
            assert (got.message, got.refusals, got.rewound) == (
                want.message,
                want.refusals,
                want.rewound,
            ), i
        assert _state(fast) == _state(ref), i
    assert (Reason.CAPACITY in seen) == bool(max_ranks), seen  # the bounds were reached
    assert passed.count(True) > 300 and passed.count(False) > 100, Counter(passed)


@pytest.mark.parametrize("path", ["admit", "check"])
def test_a_step_record_out_of_the_window_is_refused_alone(path: str) -> None:
    """Before, one record of a step message stamped two days back (or 500 s ahead) had the
    whole message refused: every honest record of its job from that host in that tick."""
    gate = Gate(AdmissionConfig(future_seconds=120, max_age_seconds=3600))

    def rec(rank: int, start: float) -> StepRecord:
        return StepRecord(job_id="j", rank=rank, world_size=4, step=5, start=start, end=start + 1)

    good = T0 + 995
    message = StepMessage(
        host="h1",
        ts=NOW,
        job_id="j",
        steps=[rec(0, good), rec(1, NOW - 2 * 86400), rec(2, NOW + 499), rec(3, good)],
    )
    out = gate.admit(message, NOW) if path == "admit" else gate.check(message, NOW)
    assert out is not None
    assert [r.reason for r in out.refusals] == [Reason.TOO_OLD, Reason.FUTURE]
    assert out.message is not None and [r.rank for r in out.message.steps] == [0, 3]
