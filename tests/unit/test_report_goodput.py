"""Goodput/badput split of a job's rank-seconds (stepwatch.report.goodput)."""

from __future__ import annotations

import pytest

from stepwatch.report.goodput import Badput, breakdown

pytestmark = pytest.mark.unit


def step(n: int, start: float, dur: float = 1.0, *, world: int = 4, data: float = 0.0,
         ckpt: float = 0.0, rows: int = 4) -> dict:
    return {"step": n, "start": start, "end": start + dur, "step_s": dur, "world": world,
            "rank_s": rows * dur, "data_s": world * data, "checkpoint_s": world * ckpt,
            "rows": rows, "ranks": world}


def test_steady_run_is_all_productive_but_its_data_and_checkpoint_phases() -> None:
    steps = [step(i, float(i), data=0.1, ckpt=0.2 if i == 5 else 0.0) for i in range(10)]
    b = breakdown(steps)
    assert b.available_s == pytest.approx(40.0)
    assert b.seconds[Badput.DATA_LOADING] == pytest.approx(4.0)
    assert b.seconds[Badput.CHECKPOINT] == pytest.approx(0.8)
    assert b.seconds[Badput.DISRUPTION] == 0
    assert b.goodput == pytest.approx((40 - 4 - 0.8) / 40)
    assert sum(b.seconds.values()) == pytest.approx(b.available_s)


def test_a_hang_and_a_rerun_step_are_disruption() -> None:
    steps = [step(0, 0.0), step(1, 1.0), step(2, 22.0, rows=8)]  # 20 s gap, step 2 run twice
    b = breakdown(steps)
    assert b.available_s == pytest.approx(4 * 23.0)
    assert b.seconds[Badput.DISRUPTION] == pytest.approx(4 * 20.0 + 4.0)
    assert b.seconds[Badput.PRODUCTIVE] == pytest.approx(12.0)


def test_no_steps_is_empty() -> None:
    b = breakdown([])
    assert b.available_s == 0 and b.goodput == 0
