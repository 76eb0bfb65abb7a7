"""One incident per fault: host-level stragglers, network faults localized, linked slowdowns.

Driven by the independent "wild" generator (stepwatch.quality.wild): DDP or
explicit accounting, Student-t/Pareto noise, irregular pauses, bursty congestion.
"""

from __future__ import annotations

import pytest

from stepwatch.contract import DetectionMessage
from stepwatch.quality.wild import Fault, Job, Kind, generate
from stepwatch.streams.core import Engine
from tests.support.detect_synth import drive, opened

pytestmark = pytest.mark.unit


def _run(job: Job) -> list[DetectionMessage]:
    return drive(Engine(), list(generate(job)))


def _incidents(found: list[DetectionMessage]) -> list[DetectionMessage]:
    return [d for d in opened(found) if not d.related]


@pytest.mark.parametrize("accounting", ["ddp", "explicit"])
def test_host_data_stall_is_one_host_level_detection(accounting: str) -> None:
    job = Job(
        "hds",
        seed=3,
        nodes=4,
        steps=160,
        accounting=accounting,
        step_s=1.0,
        fault=Fault(Kind.HOST_DATA, start=80, severity=0.2, host=2),
    )
    found = _run(job)
    incidents = _incidents(found)
    assert len(incidents) == 1, [d.summary for d in incidents]
    d = incidents[0]
    assert (d.type, d.rank, d.host, d.cause) == ("straggler", None, job.host(2), "host_input")
    assert set(d.ranks) <= set(range(16, 24)) and len(d.ranks) >= 6
    # a job slowdown it causes belongs to it
    for j in opened(found, "job_slowdown"):
        assert j.related == d.id


@pytest.mark.parametrize("accounting", ["ddp", "explicit"])
def test_congested_nic_is_a_network_detection_with_host_device_port(accounting: str) -> None:
    job = Job(
        "nic",
        seed=5,
        nodes=4,
        steps=160,
        accounting=accounting,
        step_s=1.0,
        fault=Fault(Kind.NIC_CONGESTION, start=80, severity=0.2, host=1, port=3),
    )
    incidents = _incidents(_run(job))
    assert len(incidents) == 1, [d.summary for d in incidents]
    d = incidents[0]
    assert (d.type, d.cause, d.fault) == ("job_slowdown", "network", "system")
    assert (d.host, d.device, d.port) == (job.host(1), "mlx5_3", 1)
    assert float(d.evidence["xmit_wait_per_s"]) > 4 * float(d.evidence["peer_xmit_wait_per_s"])
    assert d.evidence["own_before_xmit_wait_per_s"] is not None


def test_pipeline_link_congestion_names_the_senders_port() -> None:
    job = Job(
        "pp",
        seed=9,
        nodes=4,
        stages=2,
        steps=160,
        step_s=1.0,
        fault=Fault(Kind.PP_LINK, start=80, severity=0.2, host=0, port=6, stage=1),
    )
    incidents = _incidents(_run(job))
    assert [(d.type, d.cause, d.host, d.device) for d in incidents] == [
        ("job_slowdown", "network", job.host(0), "mlx5_6")
    ]


def test_lemon_host_is_one_incident_with_gpu_cause() -> None:
    job = Job(
        "lemon",
        seed=4,
        nodes=4,
        steps=160,
        step_s=1.0,
        fault=Fault(Kind.LEMON_HOST, start=80, severity=0.2, host=3),
    )
    incidents = _incidents(_run(job))
    assert [(d.rank, d.host, d.cause) for d in incidents] == [(None, job.host(3), "gpu")]


def test_healthy_256_ranks_heavy_tails_is_silent() -> None:
    job = Job("big", seed=11, nodes=32, steps=220, step_s=2.0, accounting="ddp")
    assert opened(_run(job)) == []


def test_host_incident_after_one_of_its_ranks_continues_that_incident() -> None:
    from tests.support.detect_synth import Job as SynthJob

    slow = {8: (20, 0.15), **{r: (45, 0.15) for r in range(9, 16)}}
    found = opened(
        drive(Engine(), SynthJob(world=32, steps=90, slow_data=slow).messages()), "straggler"
    )
    first = [d for d in found if d.rank == 8]
    host = [d for d in found if d.rank is None]
    assert len(first) == 1 and len(host) == 1, [d.summary for d in found]
    assert host[0].related == first[0].id  # one incident: the host-level one is linked
    assert [d for d in found if not d.related] == first
