"""The NVML collector against a real GPU through the real pynvml (skipped without one)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from stepwatch.agents.collectors.base import HealthState, HostContext
from stepwatch.agents.collectors.nvml import NvmlCollector
from stepwatch.agents.collectors.nvml_api import NvmlError, RealNvml
from stepwatch.agents.collectors.nvml_replay import ReplayNvml
from stepwatch.contract import GpuMessage, decode, encode
from tests.support import paths

pytestmark = pytest.mark.gpu
ROOT = paths.ROOT


@pytest.fixture(scope="module")
def gpu_count() -> int:
    probe = RealNvml()
    try:
        probe.init()
        count = probe.device_count()
        probe.shutdown()
    except NvmlError as err:
        pytest.skip(f"no usable NVML here ({err.reason})")
    if count == 0:
        pytest.skip("NVML loaded but sees no GPU")
    return count


def ctx() -> HostContext:
    return HostContext(host="gpu-host", now=time.time(), job_of_gpu={})


@pytest.mark.timeout(60)
def test_real_gpu_readings_are_plausible(gpu_count: int) -> None:
    collector = NvmlCollector(RealNvml())
    try:
        first = collector.collect(ctx())
        time.sleep(0.5)
        second = collector.collect(ctx())
    finally:
        collector.close()
    assert collector.health().state is not HealthState.DOWN
    msg0, msg1 = first[0], second[0]
    assert isinstance(msg0, GpuMessage) and isinstance(msg1, GpuMessage)
    decode(encode(msg1))  # the contract's value checks hold for real readings
    assert len(msg1.gpus) == gpu_count
    for g in msg1.gpus:
        assert g.uuid.startswith(("GPU-", "MIG-")) and g.name and g.pci_bus_id
        assert g.fb_used_mib is not None and g.fb_free_mib is not None
        assert g.fb_used_mib + g.fb_free_mib > 1024  # at least a GiB of framebuffer
        assert g.temp_gpu_c is not None and 0 < g.temp_gpu_c < 120
        assert g.power_w is not None and g.power_limit_w is not None
        assert 0 < g.power_w < g.power_limit_w * 1.5  # watts, not milliwatts
        assert 50 < g.power_limit_w < 2000
        assert g.sm_clock_max_mhz is not None and 300 < g.sm_clock_max_mhz < 4000
        assert g.sm_clock_mhz is not None and g.sm_clock_mhz <= g.sm_clock_max_mhz
        assert g.util_gpu_pct is not None and 0 <= g.util_gpu_pct <= 100
        assert g.throttle_reasons is not None
    for a, b in zip(msg0.gpus, msg1.gpus, strict=True):
        if a.energy_mj_total is not None and b.energy_mj_total is not None:
            assert b.energy_mj_total >= a.energy_mj_total


@pytest.mark.timeout(120)
def test_record_script_output_replays(gpu_count: int, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvml"))
    import record  # tests/fixtures/nvml/record.py

    out = tmp_path / "rec.json"
    assert record.main(["--samples", "2", "--interval", "0.2", "-o", str(out)]) == 0
    replay = NvmlCollector(ReplayNvml.from_file(out, clock=lambda: 0.0))
    real = NvmlCollector(RealNvml())
    try:
        replayed = replay.collect(ctx())[0]
        live = real.collect(ctx())[0]
    finally:
        real.close()
    assert isinstance(replayed, GpuMessage) and isinstance(live, GpuMessage)
    assert [g.uuid for g in replayed.gpus] == [g.uuid for g in live.gpus]
    assert [g.power_limit_w for g in replayed.gpus] == [g.power_limit_w for g in live.gpus]
