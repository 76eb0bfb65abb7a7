"""The NVML collector over readings recorded on real NVIDIA GPUs (no GPU needed).

``tests/fixtures/nvml/<card>_1gpu_idle_busy.json`` is ``record.py`` output from
one GPU: 32 samples 0.5 s apart, idle, then bf16 matrix products for about 8 s
(``scripts/device_gpu_check.sh``); on the H200 the load ended before the last
samples, on the H100 with the last one. ``<card>_agent_gpu.jsonl`` is what a
real ``stepwatch agent --collectors steps,nvml`` published on that machine
while 4-rank DDP jobs shared the GPU. Both cards ran driver 580.159.04.

What the real readings taught (and the synthetic recordings assumed otherwise
or could not show): an idle GPU reports the ``idle`` clocks-event reason (0x1)
at 345 MHz; under full load it sits at the software power cap (0x4) with the SM
clock below its maximum, which is normal, not a fault: the H200 near 600 W of
its 700 W limit, the H100 at the limit itself, one reading 701 W (a power
reading may pass the limit a little); HBM temperature is readable; NVLink
throughput is not supported on a GPU without NVLink peers.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
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
NVML = paths.FIXTURES / "nvml"
IDLE, SW_POWER_CAP = 0x1, 0x4


@dataclass(frozen=True)
class Card:
    """What one recorded card is, and the ranges its real readings fall in."""

    prefix: str
    name: str
    fb_mib: tuple[float, float]  # used + free
    busy_power_w: tuple[float, float]

    @property
    def recording(self) -> Path:
        return NVML / f"{self.prefix}_1gpu_idle_busy.json"

    @property
    def agent_gpu(self) -> Path:
        return NVML / f"{self.prefix}_agent_gpu.jsonl"


CARDS = [
    Card("h200", "NVIDIA H200", (140_000, 145_000), (550, 700)),
    Card("h100", "NVIDIA H100 80GB HBM3", (80_000, 82_000), (650, 700 * 1.01)),
]
cards = pytest.mark.parametrize("card", CARDS, ids=[c.prefix for c in CARDS])


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def readings(card: Card) -> list[GpuReading]:
    """Every sample of the recording, read through the collector at its own pace."""
    clock = Clock()
    collector = NvmlCollector(ReplayNvml.from_file(card.recording, clock=clock))
    out: list[GpuReading] = []
    for _ in range(32):
        msgs = collector.collect(HostContext(host=f"{card.prefix}-node", now=1.79e9, job_of_gpu={}))
        (msg,) = [m for m in msgs if isinstance(m, GpuMessage)]
        assert decode(encode(msg)) == msg  # the contract's checks hold for real values
        out.append(msg.gpus[0])
        clock.t += 0.5
    assert collector.health().state is HealthState.OK
    return out


def nn(value: Any) -> Any:
    assert value is not None
    return value


@cards
def test_the_recording_is_real_and_complete(card: Card) -> None:
    load_recording(card.recording)  # the replay format's checks
    rec = json.loads(card.recording.read_text())
    assert rec["source"].startswith("recorded by")  # not synthesize.py's
    (device,) = rec["devices"]
    assert device["static"]["name"] == card.name and len(device["samples"]) == 32


@cards
def test_idle_then_loaded_in_base_units(card: Card) -> None:
    rs = readings(card)
    idle, busy = rs[:12], [r for r in rs if nn(r.util_gpu_pct) >= 90]
    assert len(busy) >= 10
    low, high = card.fb_mib
    for r in rs:
        assert r.name == card.name and r.uuid.startswith("GPU-")
        assert r.power_limit_w == 700.0 and r.sm_clock_max_mhz == 1980.0  # mW -> W
        assert low < nn(r.fb_used_mib) + nn(r.fb_free_mib) < high  # bytes -> MiB
        assert r.temp_mem_c is not None  # HBM temperature is readable
        assert r.nvlink_tx_bytes_total is None  # not supported without NVLink peers
    for r in idle:
        assert 60 < nn(r.power_w) < 120 and r.sm_clock_mhz == 345.0
        assert r.throttle_reasons == IDLE
    low, high = card.busy_power_w
    for r in busy[1:]:  # the first loaded sample is still ramping up (424 W, 450 W)
        assert low < nn(r.power_w) < high
        assert 1500 < nn(r.sm_clock_mhz) < 1980  # held below max by the power cap
        assert r.throttle_reasons == SW_POWER_CAP
        assert nn(r.temp_gpu_c) > nn(idle[0].temp_gpu_c)
    energy = [nn(r.energy_mj_total) for r in rs]
    assert all(b >= a for a, b in itertools.pairwise(energy))
    # energy over the loaded half-seconds agrees with the power readings (mJ)
    i = rs.index(busy[2])
    assert energy[i + 1] - energy[i] == pytest.approx(0.5 * nn(rs[i].power_w) * 1000, rel=0.2)


@cards
def test_full_load_shows_as_power_cap_which_no_alert_treats_as_a_fault(card: Card) -> None:
    rs = readings(card)
    busy = next(r for r in rs if r.throttle_reasons == SW_POWER_CAP)
    series = HostSeries()
    series.observe([GpuMessage(host="node", ts=1.79e9, gpus=[busy])])
    text = render_series(series, "node")
    active = "stepwatch_gpu_clocks_event_active"
    assert value(text, active, gpu="0", reason="sw_power_cap") == 1
    for reason in ("hw_slowdown", "hw_thermal", "sw_thermal", "power_brake", "idle"):
        assert value(text, active, gpu="0", reason=reason) == 0, reason
    alerts = (
        paths.ROOT / "alerts" / "src" / "stepwatch" / "alerts" / "rules" / "gpu.yml"
    ).read_text()
    rules = [line for line in alerts.splitlines() if "clocks_event_active{" in line]
    assert rules and not any("sw_power_cap" in line for line in rules), rules


@cards
def test_a_real_agent_published_the_gpu_through_the_contract(card: Card) -> None:
    msgs = [decode(line) for line in card.agent_gpu.read_bytes().splitlines()]
    assert len(msgs) > 100 and all(isinstance(m, GpuMessage) for m in msgs)
    gpus = [m.gpus[0] for m in msgs if isinstance(m, GpuMessage)]
    assert {g.name for g in gpus} == {card.name}
    # the DDP jobs loaded the GPU part of the time: both idle and busy readings
    assert min(nn(g.util_gpu_pct) for g in gpus) < 10 < 90 < max(nn(g.util_gpu_pct) for g in gpus)
    # one agent's sequence (read back from two partitions): time moves forward with it
    in_order = sorted((m for m in msgs if isinstance(m, GpuMessage)), key=lambda m: m.seq)
    assert [m.seq for m in in_order] == list(range(len(in_order)))
    assert all(b.ts > a.ts for a, b in itertools.pairwise(in_order))
