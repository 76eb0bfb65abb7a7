"""Network detections from the RDMA counters alone, also when the job slows only a little."""

from __future__ import annotations

import pytest

from stepwatch.contract import DetectionMessage, Message
from stepwatch.quality.wild import Fault, Kind, generate
from stepwatch.quality.wild import Job as WildJob
from stepwatch.streams.core import Engine
from tests.support.detect_synth import Job, drive, gpu_message, interleave, opened, port_message

pytestmark = pytest.mark.unit


def _incidents(found: list[DetectionMessage]) -> list[DetectionMessage]:
    return [d for d in opened(found) if not d.related]


@pytest.mark.parametrize("accounting", ["ddp", "explicit"])
def test_congested_port_of_a_job_that_slows_two_percent_is_reported(accounting: str) -> None:
    job = WildJob(
        "nic2",
        seed=8,
        nodes=4,
        steps=200,
        accounting=accounting,
        step_s=1.0,
        fault=Fault(Kind.NIC_CONGESTION, start=90, severity=0.02, host=2, port=5),
    )
    found = drive(Engine(), list(generate(job)))
    (d,) = _incidents(found)
    assert (d.type, d.cause, d.fault) == ("network_congestion", "network", "system")
    assert (d.host, d.device, d.port) == (job.host(2), "mlx5_5", 1)
    assert d.step is not None and 90 <= d.step <= 110
    assert d.evidence["own_before_cnp_per_s"] is not None


def test_healthy_ports_with_bursts_are_silent() -> None:
    job = WildJob("calm", seed=8, nodes=8, steps=300, step_s=1.0)
    assert _incidents(drive(Engine(), list(generate(job)))) == []


def test_rising_symbol_errors_are_link_errors_on_that_port() -> None:
    job = Job(world=16, steps=80)
    steps = job.messages()
    samples: list[Message] = []
    t, errors = steps[0].ts, 0
    while t < steps[-1].ts + 2:
        for h in job.hosts():
            bad = h == "h001" and t > steps[0].ts + 40
            errors += 50 if bad else 0
            counters = {6: {"symbol_error_total": errors}} if h == "h001" else None
            samples += [gpu_message(h, t), port_message(h, t, counters)]
        t += 1.0
    found = _incidents(drive(Engine(), interleave(steps, samples)))
    assert [(d.type, d.host, d.device, d.cause) for d in found] == [
        ("link_errors", "h001", "mlx5_6", "network")
    ]
