"""A host that is half of its job: found against its own history, kept open while it holds,
and not confused with a whole-job slowdown, a pipeline stage or a rank another host waits for."""

from __future__ import annotations

import numpy as np
import pytest

from stepwatch.quality.drift import DriftJob, Kind, generate
from stepwatch.streams.core import DetectConfig, Engine
from tests.support.detect_synth import Job, drive, opened

pytestmark = pytest.mark.unit


def _host_incidents(found: list) -> list:  # type: ignore[type-arg]
    return [d for d in opened(found, "straggler") if d.rank is None and not d.related]


@pytest.mark.parametrize("factor", [1.15, 1.4])
def test_a_slow_host_that_is_half_of_a_two_host_job_is_one_host_incident(factor: float) -> None:
    slow = {r: (60, factor) for r in range(4, 8)}
    job = Job(world=8, per_host=4, steps=140, slow=slow, seed=3, jitter=0.01)
    found = drive(Engine(), job.messages())
    (d,) = _host_incidents(found)
    assert d.host == "h001" and sorted(d.ranks or ()) == [4, 5, 6, 7]
    assert d.cause == "gpu", d.evidence
    assert d.first_step is not None and abs(d.first_step - 60) <= 3
    assert not opened(found, "job_slowdown") or all(
        j.related for j in opened(found, "job_slowdown")
    )


def test_it_stays_open_while_the_host_stays_slow() -> None:
    """The group median moved half way to the slow host; its own history still holds it."""
    slow = {r: (40, 1.3) for r in range(4, 8)}
    job = Job(world=8, per_host=4, steps=260, slow=slow, seed=4)
    found = drive(Engine(), job.messages())
    (d,) = _host_incidents(found)
    resolved = [m for m in found if m.id == d.id and m.state == "resolved"]
    assert all((m.step or 0) >= 255 for m in resolved), [(m.step, m.summary) for m in resolved]


def test_a_whole_job_slowdown_is_not_blamed_on_a_host() -> None:
    job = Job(world=8, per_host=4, steps=140, seed=5, job_factor=lambda s: 1.3 if s >= 60 else 1.0)
    found = drive(Engine(), job.messages())
    assert _host_incidents(found) == []
    assert opened(found, "job_slowdown")


def test_healthy_two_host_jobs_are_silent() -> None:
    for seed in range(4):
        job = Job(world=8, per_host=4, steps=300, seed=seed, jitter=0.03)
        assert opened(drive(Engine(), job.messages())) == [], seed


def test_a_host_that_is_a_whole_pipeline_stage_is_a_group_slowdown() -> None:
    """Each host is one stage: no host has peers off it, the group slowdown names the stage."""
    job = Job(world=8, per_host=4, stages=2, steps=140, seed=6, group_factor={"pp1": (60, 1.3)})
    found = drive(Engine(), job.messages())
    assert _host_incidents(found) == []


def test_without_its_own_history_the_host_incident_resolves_while_still_slow() -> None:
    """``host_history_max_hosts`` below the job's hosts turns the own history off: the peer
    comparison alone lets the incident go once the group's spread has absorbed the split
    (what the own history is for)."""
    slow = {r: (40, 1.3) for r in range(4, 8)}
    job = Job(world=8, per_host=4, steps=260, slow=slow, seed=4)
    found = drive(Engine(DetectConfig(host_history_max_hosts=1)), job.messages())
    (d,) = _host_incidents(found)
    assert [m for m in found if m.id == d.id and m.state == "resolved" and (m.step or 0) < 200]


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_the_drift_familys_half_host_under_heavy_tailed_drift(seed: int) -> None:
    job = DriftJob(
        f"half-{seed}",
        seed,
        nodes=2,
        steps=200,
        step_s=1.0,
        ddp=bool(seed % 2),
        kind=Kind.HALF_HOST,
        start=100,
        severity=0.2,
        host=1,
    )
    (d,) = _host_incidents(drive(Engine(), list(generate(job))))
    assert d.host == job.host_name(1)
    assert d.cause == "gpu"
    assert d.first_step is not None and abs(d.first_step - 100) <= 3
    assert np.isfinite(d.score or np.nan)
