"""The simulator's step timing behaves like synchronous training (BRIEF §4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stepwatch.contract import EventMessage, EventType, encode
from stepwatch.sim import Fault, FaultKind, Scenario, StepTable, resolve_all, simulate

QUIET: dict[str, Any] = {"eval_every": 0, "checkpoint_every": 0}


def table(sc: Scenario) -> StepTable:
    return StepTable.from_messages(simulate(sc))


def lines(*scenarios: Scenario) -> list[bytes]:
    return [encode(m) for m in simulate(*scenarios)]


def test_same_seed_gives_identical_bytes_and_another_seed_does_not() -> None:
    sc = Scenario(nodes=2, steps=40, faults=(Fault(FaultKind.SLOW_GPU, start_step=10),))
    first, second = lines(sc), lines(sc)
    assert first == second
    assert first != lines(sc.replace(seed=2))


def test_every_rank_reports_every_step_with_a_nearly_identical_step_time() -> None:
    t = table(Scenario(nodes=4, steps=60))
    assert t.duration.shape == (60, 32) and not np.isnan(t.duration).any()
    spread = t.duration.max(axis=1) - t.duration.min(axis=1)
    assert (spread < 0.005 * np.median(t.duration, axis=1)).all()  # launch skew only
    # per-rank compute, by contrast, varies from rank to rank
    cv = t.compute.std(axis=1) / t.compute.mean(axis=1)
    assert np.median(cv) > 0.004


def test_phases_add_up_to_the_step_time() -> None:
    from stepwatch.contract import StepMessage

    for message in simulate(Scenario(nodes=1, steps=30)):
        if isinstance(message, StepMessage):
            for r in message.steps:
                p = r.phases
                assert p is not None
                total = (p.data or 0) + (p.forward or 0) + (p.backward or 0) + (p.optimizer or 0)
                total += (p.comm_wait or 0) + (p.checkpoint or 0) + sum(p.extra.values())
                assert total == pytest.approx(r.end - r.start, abs=2e-5)


def test_straggler_has_most_compute_and_least_wait_and_slows_the_job() -> None:
    sc = Scenario(
        nodes=4, steps=120, faults=(Fault(FaultKind.SLOW_GPU, rank=5, start_step=60),), **QUIET
    )
    t = table(sc)
    before, after = t.rows(20, 60), t.rows(60)
    # (not every step: a GC pause or a noise tail on another rank can outdo it)
    assert (t.compute[after].argmax(axis=1) == 5).mean() > 0.9
    assert (t.comm_wait[after].argmin(axis=1) == 5).mean() > 0.9
    peers = np.delete(np.arange(32), 5)
    rise = np.median(t.comm_wait[after][:, peers]) - np.median(t.comm_wait[before][:, peers])
    assert rise > 0.05  # peers now wait for rank 5 (~10 % of the ~0.9 s compute)
    step_before = np.median(t.duration[before])
    assert np.median(t.duration[after]) > 1.04 * step_before
    # the total step time does not single the straggler out
    spread = np.abs(t.duration[after][:, 5] - np.median(t.duration[after], axis=1))
    assert spread.max() < 0.005


def test_pipeline_stages_differ_by_design_and_are_compared_within_stage() -> None:
    sc = Scenario(
        nodes=4,
        steps=60,
        pipeline_stages=4,
        faults=(Fault(FaultKind.SLOW_GPU, rank=9, start_step=30),),
        **QUIET,
    )
    t = table(sc)
    assert set(t.groups) == {"pp0", "pp1", "pp2", "pp3"}
    steady = t.rows(15, 30)
    med = {g: np.median(t.compute[steady][:, t.members(g)]) for g in ("pp0", "pp1", "pp3")}
    assert med["pp3"] > med["pp0"] > 1.03 * med["pp1"]  # head > embedding > middle stage
    wait = {g: np.median(t.comm_wait[steady][:, t.members(g)]) for g in ("pp1", "pp3")}
    assert wait["pp1"] > wait["pp3"] + 0.05  # light stages wait for heavy ones (bubble)
    after = t.rows(30)
    pp1 = t.members("pp1")
    assert (pp1[t.compute[after][:, pp1].argmax(axis=1)] == 9).mean() > 0.9
    # globally the slow middle-stage rank is still lighter than the head stage
    assert np.median(t.compute[after][:, 9]) < np.median(t.compute[after][:, t.members("pp3")])


def test_warmup_is_slower_and_checkpoint_and_eval_pauses_hit_all_ranks() -> None:
    sc = Scenario(nodes=2, steps=60, eval_every=20, checkpoint_every=30, warmup_steps=8)
    messages = list(simulate(sc))
    t = StepTable.from_messages(messages)
    steady = np.median(t.duration[t.rows(10)])
    assert t.duration[0].min() > 2.0 * steady
    ckpt_rows = np.flatnonzero(t.checkpoint[:, 0] > 0)
    assert t.steps[ckpt_rows].tolist() == [29, 59]
    assert (t.checkpoint[ckpt_rows] > 3.0).all()  # every rank pauses
    assert (t.duration[ckpt_rows] > steady + 3.0).all()
    saves = [
        m for m in messages if isinstance(m, EventMessage) and m.type is EventType.CHECKPOINT_SAVE
    ]
    assert [m.attrs["step"] for m in saves] == [29, 59]
    from stepwatch.contract import StepMessage

    evals = {
        r.step
        for m in messages
        if isinstance(m, StepMessage)
        for r in m.steps
        if "eval" in r.phases.extra
    }  # type: ignore[union-attr]
    assert evals == {19, 39}


def test_gc_pauses_are_single_slow_steps_not_a_persistent_straggler() -> None:
    sc = Scenario(nodes=4, steps=200, gc_prob=0.01, **QUIET)
    t = table(sc)
    ratio = t.compute / np.median(t.compute, axis=1, keepdims=True)
    slow = ratio > 1.08  # a GC pause: far beyond the 1 % jitter
    assert slow.sum() > 20
    assert slow.sum(axis=0).max() <= 0.1 * len(t.steps)  # scattered over ranks
    persistent = slow[1:] & slow[:-1]  # the same rank slow twice in a row is rare
    assert persistent.sum() <= 2


def test_noise_is_heavy_tailed() -> None:
    t = table(Scenario(nodes=4, steps=400, gc_prob=0.0, **QUIET))
    ratio = (t.compute / np.median(t.compute, axis=1, keepdims=True))[20:]
    mad = np.median(np.abs(ratio - 1.0)) * 1.4826
    z = (ratio - 1.0) / mad
    assert (z > 6).sum() >= 3  # a Gaussian would give ~0 of 12160 beyond 6 sigma
    assert (z < -6).sum() == 0  # the tail is one-sided: nothing runs much faster
    data = StepTable.from_messages(simulate(Scenario(nodes=1, steps=200))).data
    assert np.median(data) < 0.02 and data.max() > 3 * np.median(data)  # small and noisy


def test_realtime_scenarios_start_now_and_share_one_clock() -> None:
    a = Scenario(realtime=True)
    b = Scenario(job_id="b", realtime=True)
    ra, rb = resolve_all((a, b), now=1_800_000_000.0)
    assert ra.start_ts == rb.start_ts == 1_800_000_000.0 and not ra.realtime
    assert Scenario().resolved() == Scenario()  # a fixed default start, not the wall clock
