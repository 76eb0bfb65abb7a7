"""Ranks that report from another host: a requeue that resumed right after its checkpoint.

Before: the core knew a restart only by a step number going back. In the demo
the job was requeued on new nodes just after its checkpoint at step 49 and
resumed at step 50 (3 runs of 4): the open straggler of the drained node's rank
was carried over and re-attributed to the healthy node the rank now ran on
("rank 13 (node04 gpu 5) has 14.2 % more forward,backward time"), and the new
run's warm-up steps opened a job slowdown against the old run's baseline.
"""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import DetectionMessage, StepMessage
from stepwatch.streams.core import Engine
from tests.support.detect_synth import Job, drive, opened

pytestmark = pytest.mark.unit

WARMUP = {50: 2.9, 51: 2.5, 52: 2.2, 53: 1.9}  # the demo's first steps after a restart


def _run2(hosts: dict[str, str], gap: float, after: float, seed: int) -> list[StepMessage]:
    """Steps 50-99 of a healthy run on ``hosts`` (old name -> new), starting ``gap`` s
    after ``after``, its first steps slow (warm-up)."""
    job = Job(world=16, steps=100, jitter=0.02, seed=seed, job_factor=lambda s: WARMUP.get(s, 1.0))
    msgs = [m for m in job.messages() if m.steps[0].step >= 50]
    shift = after + gap - min(r.start for r in msgs[0].steps)
    out = []
    for m in msgs:
        steps = [
            msgspec.structs.replace(
                r, host=hosts.get(r.host, r.host), start=r.start + shift, end=r.end + shift
            )
            for r in m.steps
        ]
        out.append(
            msgspec.structs.replace(m, host=hosts.get(m.host, m.host), ts=m.ts + shift, steps=steps)
        )
    return out


def _requeued(
    hosts: dict[str, str], seed: int, engine: Engine | None = None
) -> tuple[list[DetectionMessage], list[str]]:
    run1 = Job(world=16, steps=50, jitter=0.02, seed=seed, slow={3: (20, 1.5)}).messages()
    end = max(r.end for m in run1 for r in m.steps)
    run2 = _run2(hosts, 12.0, end, seed + 100)
    dets = drive(engine or Engine(), [*run1, *run2], until=run2[-1].ts + 5)
    return dets, sorted(hosts.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_requeue_on_new_nodes_right_after_the_checkpoint_is_a_restart(seed: int) -> None:
    engine = Engine()
    dets, new_hosts = _requeued({"h000": "n000", "h001": "n001"}, seed, engine)
    (found,) = opened(dets, "straggler")
    assert found.rank == 3 and found.host == "h000"
    after = [d for d in dets if d.ts > found.ts]
    # resolved by the restart, never carried over to the new nodes
    assert [(d.state, d.rank) for d in after if d.id == found.id] == [("resolved", 3)]
    assert not [d for d in after if d.host in new_hosts]
    assert not opened(after)  # no straggler, no job slowdown from the warm-up steps
    (stats,) = engine.stats()
    assert stats.badput_seconds["restart"] >= 12.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_step_time_after_a_restart_is_the_new_runs(seed: int) -> None:
    # 20 steps after the restart, what a remediation's outcome reads 20 s after its alert
    # resolved: the new run's step time, not the old run's straggled 1.5 s nor the warm-up
    run1 = Job(world=16, steps=50, jitter=0.02, seed=seed, slow={3: (20, 1.5)}).messages()
    end = max(r.end for m in run1 for r in m.steps)
    run2 = [m for m in _run2({"h000": "n000"}, 12.0, end, seed) if m.steps[0].step < 70]
    engine = Engine()
    drive(engine, [*run1, *run2])
    (stats,) = engine.stats()
    assert stats.step_seconds_median is not None and stats.step_seconds_median < 1.1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rank_moved_off_its_slow_host_takes_no_straggler_with_it(seed: int) -> None:
    # one host of two replaced (the slow rank's): its 8 ranks move, the other 8 stay
    dets, _ = _requeued({"h000": "n000"}, seed)
    (found,) = opened(dets, "straggler")
    after = [d for d in dets if d.ts > found.ts]
    assert [d.state for d in after if d.id == found.id] == ["resolved"]
    assert not [d for d in after if d.host == "n000"]


def _renamed(m: StepMessage, host: str, ranks: set[int] | None = None) -> StepMessage:
    steps = [
        msgspec.structs.replace(r, host=host) for r in m.steps if ranks is None or r.rank in ranks
    ]
    return msgspec.structs.replace(m, host=host, steps=steps)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_node_swapped_without_a_restart_takes_no_straggler_with_it(seed: int) -> None:
    # 4 hosts; from step 50 the slow host's 8 ranks report from n000 (a quarter of the
    # job, no gap): after MOVE_STEPS steps from there, their stragglers resolve
    job = Job(world=32, steps=90, jitter=0.02, seed=seed)
    job.single = {(3, s): 1.5 for s in range(20, 50)}  # the slow GPU stays behind on h000
    msgs = [
        _renamed(m, "n000") if m.host == "h000" and m.steps[0].step >= 50 else m
        for m in job.messages()
    ]
    dets = drive(Engine(), msgs)
    (found,) = opened(dets, "straggler")
    assert found.rank == 3 and found.host == "h000"
    (done,) = [d for d in dets if d.id == found.id and d.state == "resolved"]
    assert done.step is not None and 50 <= done.step <= 53
    assert "moved from h000 to n000" in done.summary
    assert not [d for d in dets if d.host == "n000"]


@pytest.mark.parametrize("forged", [{3}, set(range(8, 16))])
def test_forged_records_from_another_host_resolve_no_real_straggler(forged: set[int]) -> None:
    # one record of the slow rank, or half the job, from "evil" at step 60, sent first (the
    # real records of that step are then duplicates), no gap: the real records that follow
    # come from the real hosts again, so nothing moved and nothing restarted
    msgs = Job(world=16, steps=90, jitter=0.02, seed=1, slow={3: (20, 1.5)}).messages()
    at = next(i for i, m in enumerate(msgs) if m.steps[0].step == 60)
    fakes = [_renamed(m, "evil", forged) for m in msgs[at : at + 2]]
    dets = drive(Engine(), [*msgs[:at], *[f for f in fakes if f.steps], *msgs[at:]])
    (found,) = opened(dets, "straggler")
    assert found.rank == 3
    assert not [d for d in dets if d.id == found.id and d.state == "resolved"]  # still open
    assert not [d for d in dets if d.host == "evil"]
