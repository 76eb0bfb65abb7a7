"""The NVML collector over readings recorded on a real NVIDIA H200 (no GPU needed).

``tests/fixtures/nvml/h200_1gpu_idle_busy.json`` is ``record.py`` output from one
H200 (driver 580.159.04): 32 samples 0.5 s apart, idle, then bf16 matrix products
for about 8 s, then idle again (``scripts/device_gpu_check.sh``).
``h200_agent_gpu.jsonl`` is what a real ``stepwatch agent --collectors steps,nvml``
published on that machine while 4-rank DDP jobs shared the GPU.

What the real readings taught (and the synthetic recordings assumed otherwise
or could not show): an idle H200 reports the ``idle`` clocks-event reason (0x1)
at 345 MHz; under full load it sits at the software power cap (0x4) near 600 W
of its 700 W limit with the SM clock below its maximum, which is normal, not
a fault; HBM temperature is readable; NVLink throughput is not supported on a
GPU without NVLink peers.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from stepwatch.agents.collectors.base import HealthState, HostContext
from stepwatch.agents.collectors.nvml import NvmlCollector
from stepwatch.agents.collectors.nvml_replay import ReplayNvml, load_recording
from stepwatch.agents.host_series import HostSeries
from stepwatch.contract import GpuMessage, GpuReading, decode, encode
from tests.support import paths
from tests.support.host_metrics import render_series, value

pytestmark = pytest.mark.unit
RECORDING = paths.FIXTURES / "nvml" / "h200_1gpu_idle_busy.json"
AGENT_GPU = paths.FIXTURES / "nvml" / "h200_agent_gpu.jsonl"
IDLE, SW_POWER_CAP = 0x1, 0x4


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def readings() -> list[GpuReading]:
    """Every sample of the recording, read through the collector at its own pace."""
    clock = Clock()
    collector = NvmlCollector(ReplayNvml.from_file(RECORDING, clock=clock))
    out: list[GpuReading] = []
    for _ in range(32):
        msgs = collector.collect(HostContext(host="h200-node", now=1.79e9, job_of_gpu={}))
        (msg,) = [m for m in msgs if isinstance(m, GpuMessage)]
        assert decode(encode(msg)) == msg  # the contract's checks hold for real values
        out.append(msg.gpus[0])
        clock.t += 0.5
    assert collector.health().state is HealthState.OK
    return out


def nn(value: Any) -> Any:
    assert value is not None
    return value


def test_the_recording_is_real_and_complete() -> None:
    load_recording(RECORDING)  # the replay format's checks
    rec = json.loads(RECORDING.read_text())
    assert rec["source"].startswith("recorded by")  # not synthesize.py's
    (device,) = rec["devices"]
    assert device["static"]["name"] == "NVIDIA H200" and len(device["samples"]) == 32


def test_idle_then_loaded_then_idle_in_base_units() -> None:
    rs = readings()
    idle, busy = rs[:12], [r for r in rs if nn(r.util_gpu_pct) >= 90]
    assert len(busy) >= 10
    for r in rs:
        assert r.name == "NVIDIA H200" and r.uuid.startswith("GPU-")
        assert r.power_limit_w == 700.0 and r.sm_clock_max_mhz == 1980.0  # mW -> W
        assert 140_000 < nn(r.fb_used_mib) + nn(r.fb_free_mib) < 145_000  # bytes -> MiB
        assert r.temp_mem_c is not None  # HBM temperature is readable on an H200
        assert r.nvlink_tx_bytes_total is None  # not supported without NVLink peers
    for r in idle:
        assert 60 < nn(r.power_w) < 120 and r.sm_clock_mhz == 345.0
        assert r.throttle_reasons == IDLE
    for r in busy[1:]:  # the first loaded sample is still ramping up (424 W)
        assert 550 < nn(r.power_w) < 700
        assert 1500 < nn(r.sm_clock_mhz) < 1980  # held below max by the power cap
        assert r.throttle_reasons == SW_POWER_CAP
        assert nn(r.temp_gpu_c) > nn(idle[0].temp_gpu_c)
    energy = [nn(r.energy_mj_total) for r in rs]
    assert all(b >= a for a, b in itertools.pairwise(energy))
    # energy over the loaded half-seconds agrees with the power readings (mJ)
    i = rs.index(busy[2])
    assert energy[i + 1] - energy[i] == pytest.approx(0.5 * nn(rs[i].power_w) * 1000, rel=0.2)


def test_full_load_shows_as_power_cap_which_no_alert_treats_as_a_fault() -> None:
    rs = readings()
    busy = next(r for r in rs if r.throttle_reasons == SW_POWER_CAP)
    series = HostSeries()
    series.observe([GpuMessage(host="h200-node", ts=1.79e9, gpus=[busy])])
    text = render_series(series, "h200-node")
    active = "stepwatch_gpu_clocks_event_active"
    assert value(text, active, gpu="0", reason="sw_power_cap") == 1
    for reason in ("hw_slowdown", "hw_thermal", "sw_thermal", "power_brake", "idle"):
        assert value(text, active, gpu="0", reason=reason) == 0, reason
    alerts = (
        paths.ROOT / "alerts" / "src" / "stepwatch" / "alerts" / "rules" / "gpu.yml"
    ).read_text()
    rules = [line for line in alerts.splitlines() if "clocks_event_active{" in line]
    assert rules and not any("sw_power_cap" in line for line in rules), rules


def test_a_real_agent_published_the_gpu_through_the_contract() -> None:
    msgs = [decode(line) for line in AGENT_GPU.read_bytes().splitlines()]
    assert len(msgs) > 100 and all(isinstance(m, GpuMessage) for m in msgs)
    gpus = [m.gpus[0] for m in msgs if isinstance(m, GpuMessage)]
    assert {g.name for g in gpus} == {"NVIDIA H200"}
    # the DDP jobs loaded the GPU part of the time: both idle and busy readings
    assert min(nn(g.util_gpu_pct) for g in gpus) < 10 < 90 < max(nn(g.util_gpu_pct) for g in gpus)
    # one agent's sequence (read back from two partitions): time moves forward with it
    in_order = sorted((m for m in msgs if isinstance(m, GpuMessage)), key=lambda m: m.seq)
    assert [m.seq for m in in_order] == list(range(len(in_order)))
    assert all(b.ts > a.ts for a, b in itertools.pairwise(in_order))
