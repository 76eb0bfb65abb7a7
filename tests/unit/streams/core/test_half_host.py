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


@pytest.mark.parametrize("seed", [21, 22, 23])
@pytest.mark.parametrize("kind", ["compute", "data"])
def test_one_slow_rank_of_a_host_of_two_is_a_rank_not_the_host(seed: int, kind: str) -> None:
    """Two hosts of two ranks: one slow rank moves its host's plain median (the mean of
    two) half way, but it is one rank against three peers; the host's own history must not
    report the host. (A real DDP job with a stalled data loader on one rank did, on CI.)"""
    slow = {2: (60, 1.6)} if kind == "compute" else {}
    slow_data = {2: (60, 0.6)} if kind == "data" else {}
    job = Job(world=4, per_host=2, steps=160, slow=slow, slow_data=slow_data, seed=seed)
    found = drive(Engine(), job.messages())
    assert _host_incidents(found) == [], [(d.summary, d.evidence) for d in _host_incidents(found)]
    (d,) = [d for d in opened(found, "straggler") if not d.related]
    assert (d.rank, d.host) == (2, "h001"), d.summary


@pytest.mark.parametrize("seed", [21, 22])
def test_both_ranks_of_a_host_of_two_slow_are_the_host(seed: int) -> None:
    slow = {r: (60, 1.3) for r in (2, 3)}
    job = Job(world=4, per_host=2, steps=160, slow=slow, seed=seed)
    (d,) = _host_incidents(drive(Engine(), job.messages()))
    assert d.host == "h001" and sorted(d.ranks or ()) == [2, 3], d.summary


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_a_slow_data_rank_beside_a_slightly_slow_compute_neighbour_is_not_one_host(
    seed: int,
) -> None:
    """What a real DDP job on CI did: rank 2's data loader stalled (+60 % of a step) while
    its neighbour on the same host computed 12 % slower (the host's cores are shared).
    Two ranks of one host slow is one host-level incident only when they are slowed
    alike; here rank 2 is the incident, and rank 3, when material, is part of it
    (``related``: one host, one page)."""
    job = Job(
        world=4,
        per_host=2,
        steps=160,
        slow_data={2: (60, 0.6)},
        slow={3: (60, 1.12)},
        seed=seed,
    )
    found = drive(Engine(), job.messages())
    assert _host_incidents(found) == [], [d.summary for d in _host_incidents(found)]
    mine = [d for d in opened(found, "straggler") if d.rank == 2 and not d.related]
    assert len(mine) == 1 and mine[0].cause == "host_input", [d.summary for d in found]
    new = [d for d in opened(found, "straggler") if not d.related]
    assert [d.rank for d in new] == [2], [d.summary for d in new]
    for d in opened(found, "straggler"):
        assert d.rank == 2 or d.related == mine[0].id, d.summary


@pytest.mark.parametrize("per_host", [2, 4])
def test_a_hosts_own_history_grows_only_when_most_of_its_ranks_do(per_host: int) -> None:
    """The host metric is the lower median of its ranks: one stalled rank of a host of two
    (whose plain median, the mean, it moves half way) does not make the host slow against
    its own history; all of them do."""
    world = 2 * per_host
    one = Job(world=world, per_host=per_host, steps=120, slow_data={world - 1: (60, 0.6)})
    engine = Engine()
    drive(engine, one.messages())
    assert engine.jobs[one.job_id].host_history.slow_host(1.0) is None
    every = {r: (60, 0.6) for r in range(per_host, world)}
    all_slow = Job(world=world, per_host=per_host, steps=120, slow_data=every)
    engine = Engine()
    drive(engine, all_slow.messages())
    found = engine.jobs[all_slow.job_id].host_history.slow_host(1.0)
    assert found is not None and found.host == "h001", found


def _stall_then_host(seed: int) -> Job:
    """Rank 9's data loader stalls at step 40; from step 100 its whole host (ranks 8-15)
    computes 30 % slower."""
    return Job(
        world=16,
        per_host=8,
        steps=200,
        slow_data={9: (40, 0.6)},
        slow={r: (100, 1.3) for r in range(8, 16)},
        seed=seed,
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_a_host_slowing_after_one_of_its_ranks_stalled_is_a_host_incident_beside_it(
    seed: int,
) -> None:
    """Rank 9's data loader stalls at step 40; at step 100 the whole host computes 30 %
    slower. The stalled rank stays its own incident (host_input); the seven ranks slowed
    alike become one host-level incident (gpu) linked to it, not seven rank incidents and
    not one host incident with the data stall's cause."""
    found = opened(drive(Engine(), _stall_then_host(seed).messages()), "straggler")
    (rank9,) = [d for d in found if d.rank == 9]
    assert rank9.cause == "host_input" and not rank9.related, rank9.summary
    (host,) = [d for d in found if d.rank is None]
    assert sorted(host.ranks or ()) == [8, 10, 11, 12, 13, 14, 15], host.summary
    assert host.cause == "gpu" and host.related == rank9.id, host.summary
    assert len(found) == 2, [d.summary for d in found]


@pytest.mark.parametrize("world", [16, 32])
def test_a_host_slowed_unevenly_by_one_cause_is_one_host_incident(world: int) -> None:
    """Eight ranks of one host compute 10 % to 40 % slower: one fault however uneven (ranks
    are alike by how they are slow, not by how much)."""
    slow = {8 + i: (60, 1.10 + 0.3 * i / 7) for i in range(8)}
    for seed in (1, 2, 3):
        job = Job(world=world, per_host=8, steps=140, slow=slow, seed=seed)
        found = [d for d in opened(drive(Engine(), job.messages()), "straggler") if not d.related]
        assert len(found) == 1, [d.summary for d in found]
        (d,) = found
        assert d.rank is None and d.cause == "gpu" and len(d.ranks or ()) >= 6, d.summary


@pytest.mark.parametrize("extra", [0.2, 0.6])
def test_a_data_stall_beside_a_host_compute_slowdown_is_its_own_incident(extra: float) -> None:
    """Ranks 4 and 5 compute 20-40 % slower while rank 6's data loader stalls: the host
    incident holds the two slowed alike (gpu), rank 6 is its own (host_input), linked."""
    factor = 1.4 if extra < 0.5 else 1.2
    job = Job(
        world=16,
        per_host=4,
        steps=140,
        slow={4: (60, factor), 5: (60, factor)},
        slow_data={6: (60, extra)},
        seed=1,
    )
    found = opened(drive(Engine(), job.messages()), "straggler")
    (host,) = [d for d in found if d.rank is None]
    (rank6,) = [d for d in found if d.rank == 6]
    assert sorted(host.ranks or ()) == [4, 5] and host.cause == "gpu", host.summary
    assert rank6.cause == "host_input" and rank6.related == host.id, rank6.summary


def test_a_host_incident_keeps_to_the_ranks_slowed_its_way() -> None:
    """Its updates do not take in a rank slowed another way, which has its own incident."""
    found = drive(Engine(), _stall_then_host(1).messages())
    (host,) = [d for d in opened(found, "straggler") if d.rank is None]
    for d in found:
        if d.id == host.id:
            assert 9 not in (d.ranks or ()) and d.cause == "gpu", (d.state, d.step, d.summary)
