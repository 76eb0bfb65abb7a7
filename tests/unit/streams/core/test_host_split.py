"""A host that is half of its job and slow from the job's start (hostsplit.py).

Its own history has no earlier self to stand out against, and the peer median of a
job of two hosts sits half way between the halves: it is found against the job's
other hosts, when their ranks wait for it in collectives.
"""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import DetectionMessage, StepMessage
from stepwatch.settings import Settings
from stepwatch.streams.core import DetectConfig, Engine
from tests.support.detect_synth import Job, drive, opened, with_cpu_times

pytestmark = pytest.mark.unit

SPLIT = DetectConfig(host_split=True)  # off by default (see docs/detection.md)


def split_job(
    world: int = 4, per_host: int = 2, factor: float = 1.5, until: int | None = None, **kw: object
) -> Job:
    """Every rank of the last host computes ``factor`` x from step 0 (until ``until``)."""
    steps = int(kw.pop("steps", 150))  # type: ignore[call-overload]
    last = steps if until is None else until
    single = {(r, s): factor for r in range(world - per_host, world) for s in range(last)}
    return Job(world=world, per_host=per_host, steps=steps, single=single, **kw)  # type: ignore[arg-type]


def host_opens(found: list[DetectionMessage]) -> list[DetectionMessage]:
    return [d for d in opened(found, "straggler") if d.rank is None]


@pytest.mark.parametrize("world,per_host,factor", [(4, 2, 1.5), (4, 2, 1.2), (16, 8, 1.3)])
def test_a_host_slow_from_the_start_is_found_against_the_other_hosts(
    world: int, per_host: int, factor: float
) -> None:
    job = split_job(world, per_host, factor, jitter=0.03)
    engine = Engine(SPLIT)
    found = drive(engine, job.messages())
    (d,) = host_opens(found)
    assert d.host == job.host(world - 1) and sorted(d.ranks or ()) == list(
        range(world - per_host, world)
    ), d
    assert d.evidence["basis_history"] == "peers", d.evidence
    assert abs((d.score or 0) - (factor - 1)) < 0.1, d.score
    assert d.step is not None and d.step <= 40, d.step
    assert [x for x in found if x.state == "open" and x.id != d.id] == [], found
    # its own history never saw it: the split is what found it
    assert engine.jobs[job.job_id].host_history.slow_host(1.0) is None


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("world,per_host", [(4, 2), (16, 8)])
def test_healthy_jobs_of_two_hosts_stay_silent(world: int, per_host: int, seed: int) -> None:
    job = Job(world=world, per_host=per_host, steps=200, jitter=0.05, seed=seed)
    assert opened(drive(Engine(SPLIT), job.messages())) == []


def _without_comm(messages: list[StepMessage]) -> list[StepMessage]:
    out = []
    for m in messages:
        recs = [
            msgspec.structs.replace(r, phases=msgspec.structs.replace(r.phases, comm_wait=None))
            for r in m.steps
            if r.phases is not None
        ]
        out.append(msgspec.structs.replace(m, steps=recs))
    return out


def test_a_slower_host_nobody_is_seen_waiting_for_is_not_a_split() -> None:
    """Without collective wait times nothing says the job waits for the slower host."""
    job = split_job(jitter=0.03)
    assert host_opens(drive(Engine(SPLIT), _without_comm(job.messages()))) == []


def test_a_host_whose_ranks_wait_for_a_cpu_is_cpu_contention() -> None:
    job = split_job(factor=1.5, jitter=0.03)
    # every rank waits for a CPU 40 % of its runnable time, h001's ranks 70 % (another
    # process shares their cores)
    (d,) = host_opens(drive(Engine(SPLIT), with_cpu_times(job.messages(), 0.4, {"h001": 0.7})))
    assert (d.cause, d.evidence.get("host_reasons")) == ("host_input", "cpu_contention"), d


def test_the_split_incident_resolves_when_the_host_catches_up() -> None:
    job = split_job(factor=1.5, until=90, jitter=0.03)
    found = drive(Engine(SPLIT), job.messages())
    (d,) = host_opens(found)
    done = [x for x in found if x.state == "resolved" and x.id == d.id]
    assert len(done) == 1 and done[0].step is not None and 90 <= done[0].step <= 120, done


def test_a_small_unproven_split_opens_once_it_has_lasted() -> None:
    """CPU-only ranks that all wait for a CPU alike (no extra wait on the slow host) and
    no GPU telemetry: 12 % more compute is an unproven cause, held until it lasted 30 s."""
    job = split_job(factor=1.12, jitter=0.01)
    msgs = with_cpu_times(job.messages(), 0.4)
    (d,) = host_opens(drive(Engine(SPLIT), msgs))
    assert (d.cause, d.evidence["gpu_telemetry"]) == ("gpu", "none"), d
    (plain,) = host_opens(drive(Engine(SPLIT.replace(straggler_unproven_seconds=0.0)), msgs))
    # 30 s after the onset it was first found with (up to a window, 8 steps, before that)
    assert 30 - 8 * 1.1 <= d.ts - plain.ts <= 30, (d.ts - plain.ts, d.step, plain.step)


def test_the_split_is_off_by_default() -> None:
    """Emulated hosts on one machine's cores, which the pipeline shares, split at random
    (the torch demo's pinned ranks did, before its fault): the check is opt-in."""
    job = split_job(jitter=0.03)
    assert host_opens(drive(Engine(), job.messages())) == []
    assert DetectConfig.from_settings(Settings(host_split=True)).host_split
