"""A host whose GPU samples hold no reading (the NVML collector saw no device, which
the contract allows: ``gpus`` may be empty) reads as a host without GPU signals, in
every path that reads them; it used to raise IndexError inside the core, so that the
step message that asked for a cause became a processing_error dead letter."""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import GpuMessage, StepMessage
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.core.gpubatch import gpu_signals_many
from stepwatch.streams.core.hostwindow import HostWindow

pytestmark = pytest.mark.unit


def test_samples_without_readings_give_no_gpu_signals() -> None:
    win = HostWindow("h", 8)
    for t in range(3):
        win.add(GpuMessage(host="h", ts=100.0 + t, gpus=[]))
    assert win.gpu_signals(0, 200) == {}
    assert gpu_signals_many([(win, 0, 200)]) == [{}]


def test_a_straggler_is_found_beside_a_host_that_sees_no_gpu() -> None:
    """Every GPU message of one host of the job is empty: the slow rank on another host
    is still found, with no core error."""
    fault = Fault(kind=FaultKind.SLOW_GPU, rank=3, start_step=60, severity=0.3)
    scenario = Scenario(seed=4, nodes=4, steps=160, job_id="nogpu", start_ts=1.7e9, faults=(fault,))
    messages = list(simulate(scenario))
    # the slow rank's own host is the blind one: its cause reads that host's GPUs first
    blind = next(
        m.host
        for m in messages
        if isinstance(m, StepMessage) and m.steps[0].rank <= 3 < m.steps[0].rank + len(m.steps)
    )
    engine = Engine(DetectConfig())
    found = []
    last = 0.0
    for m in messages:
        if isinstance(m, GpuMessage) and m.host == blind:
            m = msgspec.structs.replace(m, gpus=[])
        found.extend(engine.process(m))
        if m.ts - last >= 1.0:
            last = m.ts
            found.extend(engine.tick(m.ts))
    assert engine.counts["errors"] == 0
    assert any(d.type == "straggler" and d.rank == 3 for d in found)
