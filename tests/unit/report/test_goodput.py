"""Goodput/badput of a job from the store (stepwatch.report.goodput), the worker's categories."""

from __future__ import annotations

import pytest

from stepwatch.contract.goodput import PRODUCTIVE, Badput
from stepwatch.report.goodput import CATEGORIES, breakdown, slowed_steps

pytestmark = pytest.mark.unit


def step(
    n: int,
    start: float,
    dur: float = 1.0,
    *,
    world: int = 4,
    data: float = 0.0,
    ckpt: float = 0.0,
    rows: int = 4,
) -> dict:
    return {
        "step": n,
        "start": start,
        "end": start + dur,
        "step_s": dur,
        "world": world,
        "rank_s": rows * dur,
        "data_med": data,
        "ckpt_med": ckpt,
        "rows": rows,
        "ranks": world,
    }


def test_steady_run_is_all_productive_but_its_data_and_checkpoint_phases() -> None:
    steps = [step(i, float(i), data=0.1, ckpt=0.2 if i == 5 else 0.0) for i in range(10)]
    b = breakdown(steps)
    assert b.available_s == pytest.approx(40.0)
    assert b.seconds[Badput.DATA_LOADING] == pytest.approx(4.0)
    assert b.seconds[Badput.CHECKPOINT] == pytest.approx(0.8)
    assert b.seconds[Badput.STRAGGLER] == 0
    assert b.goodput == pytest.approx((40 - 4 - 0.8) / 40)
    assert sum(b.seconds.values()) == pytest.approx(b.available_s)
    assert tuple(b.seconds) == CATEGORIES


def test_a_straggler_costs_its_excess_over_the_clean_steps_baseline() -> None:
    steps = [step(i, 1.0 * i, dur=2.0 if i < 3 else 1.0) for i in range(30)]  # slow warm-up
    steps += [step(30 + i, 30 + 1.3 * i, dur=1.3) for i in range(30)]
    detections = [{"id": "s1", "type": "straggler", "state": "open", "step": 35, "first_step": 30}]
    b = breakdown(steps, detections)
    assert b.baseline_s == pytest.approx(1.0)
    assert b.seconds[Badput.STRAGGLER] == pytest.approx(4 * 30 * 0.3)  # not the warm-up
    assert b.seconds[PRODUCTIVE] == pytest.approx(4 * (27 + 3 * 2.0 + 30 * 1.0))
    assert b.step_s == pytest.approx(1.3)  # the median of the steps (half were slow), not 1.0


def test_the_baseline_removes_the_wait_for_a_straggler_it_can_see() -> None:
    """The straggler starts right after warm-up: no clean step, but the peers' extra
    collective wait (over the slow rank's own) says what the step would have taken."""
    steps = [dict(step(i, 1.3 * i, dur=1.3), wait_excess=0.3) for i in range(40)]
    detections = [{"id": "s1", "type": "straggler", "state": "open", "step": 10, "first_step": 6}]
    b = breakdown(steps, detections)
    assert b.baseline_s == pytest.approx(1.0)
    assert b.seconds[Badput.STRAGGLER] == pytest.approx(4 * 15 * 0.3)


def test_a_hang_a_restart_and_a_rerun_step() -> None:
    steps = [step(0, 0.0), step(1, 1.0), step(2, 22.0), step(2, 40.0, rows=8)]
    b = breakdown(steps)
    assert b.seconds[Badput.HANG] == pytest.approx(4 * 20.0)  # 2 s -> 22 s, steps go on
    assert b.seconds[Badput.RESTART] == pytest.approx(4 * 17.0)  # 23 s -> 40 s, step 2 again
    assert b.seconds[Badput.WASTED_PROGRESS] == pytest.approx(4.0)


def test_slowed_steps_from_detection_changes() -> None:
    changes = [
        {"id": "a", "type": "straggler", "state": "open", "step": 12, "first_step": 10},
        {"id": "a", "type": "straggler", "state": "resolved", "step": 30, "first_step": 10},
        {"id": "b", "type": "job_slowdown", "state": "open", "step": 50, "first_step": 45},
        {"id": "c", "type": "hang", "state": "open", "step": 60, "first_step": 60},
    ]
    assert sorted(slowed_steps(changes)) == [(10, 30), (45, 1 << 62)]


def test_no_steps_is_empty() -> None:
    b = breakdown([])
    assert b.available_s == 0 and b.goodput == 0
