"""Onset and cause on the fault's own steps: first_step is the estimated onset (the open
step is kept in evidence.open_step) and a changed cause is published at once."""

from __future__ import annotations

import numpy as np
import pytest

from stepwatch.quality.wild import Fault, Kind, generate
from stepwatch.quality.wild import Job as WildJob
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.core.causes import Attribution
from stepwatch.streams.core.kinds import Cause, DetectionType
from stepwatch.streams.core.kinds import Fault as FaultClass
from stepwatch.streams.core.lifecycle import DetectionBook, Finding
from tests.support.detect_synth import Job, drive, opened
from tests.unit.streams.core.test_phases import ddp_job

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("start", [23, 31])
def test_straggler_first_step_is_the_onset_and_open_step_is_kept(start: int) -> None:
    job = Job(world=16, steps=70, slow={5: (start, 1.2)}, seed=2)
    (d,) = opened(drive(Engine(), job.messages()), "straggler")
    assert d.first_step is not None and abs(d.first_step - start) <= 2
    assert d.evidence["open_step"] == d.step
    assert d.step is not None and d.step > d.first_step


@pytest.mark.parametrize("seed", range(1, 7))
def test_one_slow_step_just_before_the_fault_does_not_pull_the_onset(seed: int) -> None:
    # the window at the open holds the step 2.5x slow 3 steps before a 1.4x fault: the
    # least-squares split took it for the change (first_step 37 in each of these)
    job = Job(world=16, steps=70, jitter=0.04, seed=seed, slow={3: (40, 1.4)})
    job.single = {(3, 37): 2.5}
    (d,) = opened(drive(Engine(), job.messages()), "straggler")
    assert d.rank == 3 and d.first_step == 40


@pytest.mark.parametrize(
    ("world", "jitter", "factor", "seed", "after"),
    [
        (8, 0.03, 1.08, 1, 5),
        (8, 0.05, 1.15, 2, 5),
        (8, 0.05, 1.15, 2, 7),
        (16, 0.05, 1.08, 2, 7),
        (16, 0.05, 1.15, 4, 5),
        (16, 0.05, 1.15, 4, 7),
    ],
)
def test_one_slow_step_after_the_fault_began_does_not_pull_the_onset(
    world: int, jitter: float, factor: float, seed: int, after: int
) -> None:
    # a weak fault from step 40, one step 2.5x slow a few steps later: the open falls on
    # or just after that step, and a split that left that step alone after itself took
    # it for the change (first_step 45 or 47 in each of these)
    job = Job(world=world, steps=90, jitter=jitter, seed=seed)
    job.single = {(3, s): factor for s in range(40, 90)}
    job.single[(3, 40 + after)] = factor * 2.5
    (d,) = opened(drive(Engine(), job.messages()), "straggler")
    assert d.rank == 3 and d.first_step is not None and abs(d.first_step - 40) <= 1


@pytest.mark.parametrize(("seed", "burst", "calm"), [(1, 1.3, 1.0), (2, 1.3, 0.97), (3, 1.6, 1.0)])
def test_a_burst_well_before_the_fault_does_not_pull_the_onset(
    seed: int, burst: float, calm: float
) -> None:
    # 0.2 s steps: the open comes 8-9 steps into the fault, so the window at the open is
    # all fault and the onset came from the CUSUM, whose S a 6-step burst at steps 23-28
    # held above 0 through the 11 calm steps after it: first_step 21 or 22 in these (a
    # real DDP run in CI opened with first_step 27 for a fault from step 40 this way)
    job = Job(world=8, steps=90, jitter=0.04, seed=seed, step_s=0.2)
    job.single = {(3, s): burst for s in range(23, 29)}
    job.single.update({(3, s): calm for s in range(29, 40)})
    job.single.update({(3, s): 1.2 for s in range(40, 90)})
    last = opened(drive(Engine(), job.messages()), "straggler")[-1]
    assert last.rank == 3 and last.evidence["open_step"] >= 48
    assert last.first_step is not None and abs(last.first_step - 40) <= 3, last.first_step


def test_data_stall_cause_is_read_after_its_onset() -> None:
    (d,) = opened(drive(Engine(), ddp_job({3: ("data", 0.15)}, start=30)), "straggler")
    assert d.cause == "host_input"
    assert d.first_step is not None and abs(d.first_step - 30) <= 2


def test_job_slowdown_first_step_is_its_onset() -> None:
    job = WildJob(
        "nic",
        seed=5,
        nodes=4,
        steps=160,
        accounting="explicit",
        step_s=1.0,
        fault=Fault(Kind.NIC_CONGESTION, start=80, severity=0.2, host=1, port=3),
    )
    found = [
        d
        for d in opened(drive(Engine(), list(generate(job))))
        if d.type in ("job_slowdown", "network_congestion")
    ]
    assert found
    for d in found:
        assert d.first_step is not None and abs(d.first_step - 80) <= 3, d.type


def _finding(cause: Cause, ts: float, score: float = 0.2) -> Finding:
    attr = Attribution(cause, FaultClass.SYSTEM, cause.value, {})
    return Finding(DetectionType.STRAGGLER, score, int(ts), ts, "s", attr, rank=1)


def test_a_new_cause_is_published_at_once_a_new_score_is_rate_limited() -> None:
    book = DetectionBook("j", DetectConfig())
    assert [m.state for m in book.observe(_finding(Cause.UNKNOWN, 100.0))] == ["open"]
    assert book.observe(_finding(Cause.UNKNOWN, 103.0, score=0.5)) == []  # score: wait 30 s
    (m,) = book.observe(_finding(Cause.HOST_INPUT, 106.0))
    assert (m.state, m.cause) == ("update", "host_input")
    # a finding is built again every cause_refresh_seconds while it holds
    key = (DetectionType.STRAGGLER, 1, "")
    refresh = DetectConfig().cause_refresh_seconds
    assert book.hold(key, 100.0 + refresh) is True  # young: re-decided every refresh
    assert book.hold(key, 101.0 + refresh) is False
    assert book.hold(key, 100.5 + 2 * refresh) is True


def test_a_job_slowdowns_onset_is_the_start_of_its_trailing_run() -> None:
    from stepwatch.streams.core.slowdown import trailing_run

    x = np.array([0.0, 0.01, 0.2, 0.0, -0.01, 0.12, 0.11, 0.0, 0.14, 0.13, 0.15])
    assert trailing_run(x, 0.05) == 5  # one step below does not end it; two do
    assert trailing_run(x, 0.05, gap=0) == 2
    assert trailing_run(np.array([0.2, 0.2]), 0.05) == 1
    assert trailing_run(np.array([0.0, np.nan, 0.0]), 0.05) == 0


def test_a_steady_detection_builds_a_finding_per_cause_refresh_not_per_step() -> None:
    cfg = DetectConfig()
    book = DetectionBook("j", cfg)
    book.observe(_finding(Cause.GPU, 100.0, score=0.2))
    key = (DetectionType.STRAGGLER, 1, "")
    late = 100.0 + cfg.update_min_seconds + 5.0  # old, past the score's rate limit
    assert book.hold(key, late, 0.2) is True  # the cause is due for its look
    book.observe(_finding(Cause.GPU, late, score=0.2))  # nothing to publish: same score
    # the same score on the next steps: no Finding to build, no message could follow
    assert [book.hold(key, late + dt, 0.21) for dt in (1.0, 2.0, 3.0)] == [False] * 3
    assert book.open[key].score_now == 0.21  # the live view still sees the score now
    assert book.hold(key, late + 4.0, 0.4) is True  # moved enough for an update
    (m,) = book.observe(_finding(Cause.GPU, late + 4.0, score=0.4))
    assert m.state == "update" and m.score == 0.4
    assert book.hold(key, late + 5.0) is False  # rate limit of the score again
    assert book.hold(key, late + 4.0 + cfg.update_min_seconds) is True  # and its cause
    assert book.hold(key, late + 4.0 + 2 * cfg.update_min_seconds, 0.4) is True


@pytest.mark.parametrize(("world", "gap", "seed"), [(8, 12, 4), (16, 40, 2)])
def test_a_fault_that_returns_gets_its_own_onset(world: int, gap: int, seed: int) -> None:
    # a review's case: the median split alone sent the second window (jump ~3 spreads)
    # to a CUSUM whose S had stayed above 0 since the first incident: first_step 40
    back = 100 + gap
    job = Job(world=world, steps=back + 80, jitter=0.05, seed=seed)
    job.single = {(3, s): 1.15 for s in [*range(40, 100), *range(back, back + 80)]}
    first, second = opened(drive(Engine(), job.messages()), "straggler")
    assert first.first_step is not None and abs(first.first_step - 40) <= 3
    assert second.first_step is not None and abs(second.first_step - back) <= 3
