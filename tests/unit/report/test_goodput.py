"""Goodput/badput of a job from the store (stepwatch.report.goodput), the worker's categories."""

from __future__ import annotations

import pytest

from stepwatch.contract.goodput import PRODUCTIVE, Badput
from stepwatch.report.data import run_starts
from stepwatch.report.goodput import CATEGORIES, breakdown, checkpoint_spans, slowed_steps

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
    run: int = 0,
    hosts: str = "a,b",
) -> dict:
    return {
        "run": run,
        "hosts": hosts,
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


def test_the_outage_between_two_runs_is_restart_and_the_steps_run_again_are_wasted() -> None:
    """Run 1 reached step 9, the job came back 12 s later from the checkpoint at step 5:
    one row per step of each run (report.data), so no step spans the outage."""
    steps = [step(i, float(i)) for i in range(10)]
    steps += [step(5 + i, 22.0 + i, run=1, hosts="c,b") for i in range(10)]
    b = breakdown(steps)
    assert b.seconds[Badput.RESTART] == pytest.approx(4 * 12.0)
    assert b.seconds[Badput.HANG] == 0
    assert b.seconds[Badput.WASTED_PROGRESS] == pytest.approx(4 * 5.0)  # steps 5-9 of run 1
    assert b.seconds[PRODUCTIVE] == pytest.approx(4 * 15.0)
    assert sum(b.seconds.values()) == pytest.approx(b.available_s)


def test_a_quick_restart_is_restart_time_however_short() -> None:
    steps = [step(i, float(i)) for i in range(10)] + [step(8, 11.5, run=1), step(9, 12.5, run=1)]
    b = breakdown(steps)
    assert b.seconds[Badput.RESTART] == pytest.approx(4 * 1.5)  # under GAP_FACTOR x the step
    assert b.seconds[Badput.OTHER] == pytest.approx(0.0)


def test_a_long_gap_is_a_restart_when_the_hosts_changed_or_a_restart_event_says_so() -> None:
    """A requeue that resumed right after its checkpoint: no step number went back."""
    before = [step(i, float(i)) for i in range(5)]
    moved = breakdown([*before, step(5, 20.0, hosts="c,b"), step(6, 21.0, hosts="c,b")])
    assert (moved.seconds[Badput.RESTART], moved.seconds[Badput.HANG]) == (4 * 15.0, 0)
    same = [*before, step(5, 20.0), step(6, 21.0)]
    assert breakdown(same).seconds[Badput.HANG] == pytest.approx(4 * 15.0)
    told = breakdown(same, events=[{"ts": 12.0, "type": "restart"}])
    assert (told.seconds[Badput.RESTART], told.seconds[Badput.HANG]) == (4 * 15.0, 0)


def test_checkpoints_saved_between_steps_are_checkpoint_time_not_a_hang() -> None:
    """The torch example saves outside any step: the SDK's event with duration_s and start
    is all the store has. One inside a step is its checkpoint phase: not counted twice."""
    steps = [step(i, float(i)) for i in range(5)]
    steps += [step(5 + i, 15.0 + i) for i in range(5)]  # a 10 s save after step 4
    steps += [step(10, 20.0, dur=3.0, ckpt=2.0)]  # a save inside step 10
    events = [
        {"ts": 15.0, "type": "checkpoint_save", "duration_s": 10.0, "started": 5.0},
        {"ts": 22.5, "type": "checkpoint_save", "duration_s": 2.0, "started": None},
        {"ts": 16.0, "type": "xid", "duration_s": None, "started": None},
    ]
    b = breakdown(steps, events=events)
    assert b.seconds[Badput.CHECKPOINT] == pytest.approx(4 * (10.0 + 2.0))
    assert (b.seconds[Badput.HANG], b.seconds[Badput.RESTART]) == (0, 0)
    assert sum(b.seconds.values()) == pytest.approx(b.available_s)
    assert checkpoint_spans(events, steps) == [(5.0, 15.0)]


def test_a_checkpoint_load_during_a_restart_is_taken_out_of_the_restart() -> None:
    steps = [step(i, float(i)) for i in range(10)] + [step(8, 30.0, run=1)]
    load = {"ts": 29.0, "type": "checkpoint_load", "duration_s": 4.0, "started": None}
    b = breakdown(steps, events=[load])
    assert b.seconds[Badput.CHECKPOINT] == pytest.approx(4 * 4.0)
    assert b.seconds[Badput.RESTART] == pytest.approx(4 * 16.0)


def test_run_starts_where_the_step_numbers_go_back() -> None:
    """One rank's steps in time order; a repeated record (starting before the last end)
    is no new run."""
    rows = [{"step": i, "start": float(i), "end": i + 1.0} for i in range(10)]
    rows.insert(5, {"step": 3, "start": 3.0, "end": 4.0})  # sent twice
    rows += [{"step": 5 + i, "start": 22.0 + i, "end": 23.0 + i} for i in range(3)]
    rows += [{"step": 0, "start": 40.0, "end": 41.0}]
    assert run_starts(rows) == [16.0, 32.5]
    assert run_starts(rows[:10]) == []


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
