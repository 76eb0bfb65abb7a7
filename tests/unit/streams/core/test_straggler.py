"""Straggler scores on synchronous-training-shaped data."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from stepwatch.streams.core import DetectConfig, Engine
from tests.support.detect_synth import T0, Job, drive, num, opened


def test_straggler_found_although_every_rank_has_the_same_step_time() -> None:
    job = Job(world=16, steps=60, slow={5: (30, 1.10)})
    messages = job.messages()
    durations = {round(r.end - r.start, 9) for m in messages for r in m.steps if r.step == 45}
    assert len(durations) == 1  # synchronous: total step time says nothing
    found = opened(drive(Engine(), messages), "straggler")
    assert [d.rank for d in found] == [5]
    d = found[0]
    assert d.host == "h000" and d.gpu == 5 and d.group == "all"
    assert 0.07 < (d.score or 0) < 0.12
    assert (d.first_step or 0) - 30 <= 5  # time to detect, in steps
    assert d.evidence["basis"] == "phases"
    assert num(d, "comm_wait_s") < num(d, "comm_wait_peer_median_s")  # it waits least
    assert num(d, "compute_s") > num(d, "compute_peer_median_s")


def test_pipeline_stages_with_unequal_compute_do_not_alert() -> None:
    job = Job(world=32, steps=80, stages=4, stage_weights=(1.06, 1.0, 1.0, 1.12), jitter=0.015)
    assert drive(Engine(), job.messages()) == []


def test_pipeline_straggler_is_compared_within_its_stage() -> None:
    job = Job(
        world=32, steps=60, stages=4, stage_weights=(1.06, 1.0, 1.0, 1.12), slow={20: (25, 1.15)}
    )
    found = opened(drive(Engine(), job.messages()), "straggler")
    assert [(d.rank, d.group) for d in found] == [(20, "pp2")]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noise_pauses_and_single_slow_steps_never_alert(seed: int) -> None:
    rng = np.random.default_rng(seed)
    single = {
        (int(rng.integers(16)), int(s)): float(rng.uniform(1.2, 2.5))
        for s in rng.integers(5, 150, 40)
    }
    pauses = {s: 6.0 for s in range(20, 150, 25)}  # checkpoints/evaluations: every rank
    job = Job(world=16, steps=150, jitter=0.025, seed=seed, single=single, pauses=pauses)
    assert drive(Engine(), job.messages()) == []


def test_timestamps_only_fallback_says_so() -> None:
    job = Job(world=16, steps=50, phases=False)
    messages = job.messages()
    # without phases a straggler is visible only if its records end later than its peers'
    for m in messages:
        m.steps[:] = [
            r if r.rank != 3 or r.step < 20 else msgspec.structs.replace(r, end=r.end + 0.12)
            for r in m.steps
        ]
    found = opened(drive(Engine(), messages), "straggler")
    assert [d.rank for d in found] == [3]
    assert found[0].evidence["basis"] == "timestamps"


def test_five_percent_slower_gpu_is_found_on_quiet_data() -> None:
    job = Job(world=16, steps=60, slow={9: (20, 1.05)}, jitter=0.005)
    found = opened(drive(Engine(), job.messages()), "straggler")
    assert [d.rank for d in found] == [9]


def test_thresholds_are_configurable() -> None:
    job = Job(world=16, steps=60, slow={9: (20, 1.06)}, jitter=0.005)
    strict = DetectConfig(straggler_min_excess=0.10)
    assert opened(drive(Engine(strict), job.messages()), "straggler") == []


def test_short_steps_need_the_slowness_to_last_in_time() -> None:
    """60 ms steps: a 1 s burst (16 steps) on one rank is not an incident; the same
    slowdown that lasts is, once its run of flags is straggler_min_seconds old."""
    burst = {(5, s): 1.3 for s in range(20, 36)}
    job = Job(step_s=0.06, steps=120, single=burst)
    assert opened(drive(Engine(), job.messages()), "straggler") == []
    lasting = Job(step_s=0.06, steps=120, slow={5: (20, 1.3)})
    (d,) = opened(drive(Engine(), lasting.messages()), "straggler")
    assert d.rank == 5
    first_flag_ts = T0 + 20 * 0.06
    assert d.ts - first_flag_ts >= DetectConfig().straggler_min_seconds - 0.1
    assert (d.step or 0) - 20 <= 2.0 / 0.06 + 5
