"""Step time, straggler badput and MFU as the worker reports them (stepwatch.contract.goodput)."""

from __future__ import annotations

import pytest

from stepwatch.contract.goodput import MFU_UNKNOWN, Badput, split_step, step_time
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import Engine
from stepwatch.streams.core.api import JobStats

pytestmark = pytest.mark.unit
STRAGGLER = (Fault(FaultKind.SLOW_GPU, rank=13, start_step=40, severity=0.3),)


def stats(faults: tuple[Fault, ...] = (), **kw: float) -> JobStats:
    sc = Scenario(seed=5, job_id="j", nodes=4, steps=160, start_ts=1.7e9, faults=faults, **kw)
    engine = Engine()
    msgs = sorted(simulate(sc), key=lambda m: m.ts)
    for m in msgs:
        engine.process(m)
    engine.tick(msgs[-1].ts + 1)
    [out] = engine.stats()
    return out


def test_split_step_counts_the_time_above_the_baseline_as_straggler() -> None:
    s = split_step(
        1.3, data_s=0.05, checkpoint_s=0.0, pause_s=0.0, baseline_s=1.0, baseline_data_s=0.05
    )
    assert s.straggler == pytest.approx(0.3)
    assert s.productive == pytest.approx(0.95)
    assert s.productive + s.data_loading + s.checkpoint + s.straggler + s.pause == pytest.approx(
        1.3
    )


def test_split_step_a_data_stall_is_data_loading_and_jitter_is_not_a_straggler() -> None:
    stall = split_step(
        1.5, data_s=0.55, checkpoint_s=0.0, pause_s=0.0, baseline_s=1.0, baseline_data_s=0.05
    )
    assert stall.straggler == 0 and stall.data_loading == pytest.approx(0.55)
    assert split_step(1.03, 0.05, 0.0, 0.0, baseline_s=1.0, baseline_data_s=0.05).straggler == 0
    assert split_step(2.0, 0.0, 0.0, 0.0, baseline_s=None).straggler == 0  # no baseline yet


def test_step_time_is_the_median_of_the_steps() -> None:
    assert step_time([1.0, 1.3, 1.27, float("nan")]) == pytest.approx(1.27)
    assert step_time([]) is None


def test_a_straggler_raises_the_step_time_not_the_baseline_and_costs_goodput() -> None:
    clean, slow = stats(), stats(STRAGGLER)
    assert slow.step_seconds_median == pytest.approx(1.27, abs=0.03)  # what every rank waits
    assert slow.step_seconds_baseline == pytest.approx(1.0, abs=0.02)  # named as the baseline
    lost = slow.badput_seconds[Badput.STRAGGLER]
    assert lost == pytest.approx(120 * 0.27, rel=0.25)  # ~120 slowed steps x 0.27 s
    assert clean.badput_seconds[Badput.STRAGGLER] < 0.1 * lost
    assert slow.goodput_ratio is not None and clean.goodput_ratio is not None
    assert slow.goodput_ratio < clean.goodput_ratio - 0.1
    assert set(slow.badput_seconds) == {b.value for b in Badput}


def test_mfu_is_explained_when_the_steps_carry_no_flops() -> None:
    without = stats()
    assert without.mfu is None and without.mfu_note == MFU_UNKNOWN
    with_flops = stats(flops_per_token=6e9)
    assert with_flops.mfu is not None and 0 < with_flops.mfu < 1 and with_flops.mfu_note == ""
