"""NVML collector against the recording-backed fake (no GPU needed)."""

from __future__ import annotations

import ctypes.util
import importlib.resources
import itertools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from stepwatch.agents.collectors import build_host_collectors, parse_names
from stepwatch.agents.collectors.base import Collector, HealthState, HostContext
from stepwatch.agents.collectors.nvml import NvmlCollector
from stepwatch.agents.collectors.nvml_api import Field, NvmlError, RealNvml
from stepwatch.agents.collectors.nvml_replay import DEFAULT_RECORDING, ReplayNvml, load_recording
from stepwatch.contract import EventMessage, EventType, GpuMessage, decode, encode
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings
from tests.support import paths

FIXTURES = paths.FIXTURES / "nvml"
L40S = FIXTURES / "l40s_2gpu.json"
RAW = json.loads(DEFAULT_RECORDING.read_text())
NOW = 1_767_225_600.0
MIB = 1024 * 1024


def nn(value: Any) -> Any:
    """The value, asserted present (readings are Optional)."""
    assert value is not None
    return value


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def clock() -> Clock:
    return Clock()


def ctx(jobs: dict[int, str] | None = None) -> HostContext:
    return HostContext(host="gpu-node-017", now=NOW, job_of_gpu=jobs or {})


def gpu_message(messages: list[Any]) -> GpuMessage:
    found = [m for m in messages if isinstance(m, GpuMessage)]
    assert len(found) == 1
    return found[0]


def test_h100_readings_and_unit_conversions(clock: Clock) -> None:
    collector = NvmlCollector(ReplayNvml.from_file(clock=clock))
    msg = gpu_message(collector.collect(ctx()))
    assert collector.health().state is HealthState.OK
    assert [g.index for g in msg.gpus] == list(range(8))
    for gpu, dev in zip(msg.gpus, RAW["devices"], strict=True):
        raw = dev["samples"][0]
        assert gpu.uuid == dev["static"]["uuid"] and gpu.uuid.startswith("GPU-")
        assert gpu.name == "NVIDIA H100 80GB HBM3"
        assert gpu.pci_bus_id == dev["static"]["pci_bus_id"]
        assert gpu.power_w == pytest.approx(raw["power_usage_mw"] / 1000)  # mW -> W
        assert 500 < nn(gpu.power_w) < 700
        assert gpu.power_limit_w == 700.0
        assert gpu.sm_clock_max_mhz == 1980.0
        assert gpu.mem_clock_mhz == 2619.0
        assert gpu.fb_used_mib == raw["memory"][0] / MIB
        assert nn(gpu.fb_used_mib) + nn(gpu.fb_free_mib) == 81559.0  # bytes -> MiB
        assert gpu.energy_mj_total == raw["total_energy_mj"]
        assert gpu.nvlink_tx_bytes_total == raw["nvlink_throughput_kib"][0] * 1024  # KiB -> B
        assert gpu.nvlink_rx_bytes_total == raw["nvlink_throughput_kib"][1] * 1024
        assert gpu.util_gpu_pct == raw["utilization"][0]
        assert gpu.temp_mem_c == raw["temperature_memory"]
        assert gpu.throttle_reasons == raw["clocks_event_reasons"]
        assert gpu.ecc_dbe_total == 0
        assert gpu.remapped_rows_pending is False
        assert gpu.xid_last is None
    assert msg.gpus[5].ecc_sbe_total == 3 and msg.gpus[5].remapped_rows_correctable == 2
    assert msg.gpus[3].pcie_replay_total == 12
    decode(encode(msg), now=lambda: NOW)  # satisfies the contract's value checks


def test_replay_follows_the_clock_and_counters_never_go_back(clock: Clock) -> None:
    collector = NvmlCollector(ReplayNvml.from_file(clock=clock))
    energy: list[int] = []
    nvlink: list[int] = []
    powers = set()
    for _ in range(25):  # 2.5 passes over the 10-sample recording
        gpu0 = gpu_message(collector.collect(ctx())).gpus[0]
        energy.append(nn(gpu0.energy_mj_total))
        nvlink.append(nn(gpu0.nvlink_tx_bytes_total))
        powers.add(gpu0.power_w)
        clock.t += 1.0
    assert all(b > a for a, b in itertools.pairwise(energy))
    assert all(b > a for a, b in itertools.pairwise(nvlink))
    assert len(powers) > 5  # the samples change with time
    # 1 s at ~0.6 kW is ~600,000 mJ
    assert 500_000 < energy[1] - energy[0] < 700_000


def test_job_id_only_when_all_gpus_map_to_one_job(clock: Clock) -> None:
    collector = NvmlCollector(ReplayNvml.from_file(clock=clock))
    assert gpu_message(collector.collect(ctx({i: "j1" for i in range(8)}))).job_id == "j1"
    assert gpu_message(collector.collect(ctx({i: "j1" for i in range(4)}))).job_id is None
    mixed = {i: ("j1" if i < 4 else "j2") for i in range(8)}
    assert gpu_message(collector.collect(ctx(mixed))).job_id is None


def test_not_supported_fields_are_none_not_errors_and_not_asked_again(clock: Clock) -> None:
    api = ReplayNvml.from_file(L40S, clock=clock)
    collector = NvmlCollector(api)
    msg = gpu_message(collector.collect(ctx()))
    assert [g.name for g in msg.gpus] == ["NVIDIA L40S", "NVIDIA L40S"]
    for gpu in msg.gpus:
        assert gpu.temp_mem_c is None
        assert gpu.nvlink_tx_bytes_total is None and gpu.nvlink_rx_bytes_total is None
        assert gpu.power_limit_w == 350.0 and gpu.temp_gpu_c is not None
    health = collector.health()
    assert health.state is HealthState.OK and health.errors_total == 0
    first = api.calls
    collector.collect(ctx())
    assert api.calls - first == first - 3 * 2 - 2 * 2  # no static reads, no unsupported retries


def test_failed_call_is_none_for_that_field_counted_logged_once(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    api = ReplayNvml.from_file(clock=clock)
    collector = NvmlCollector(api)
    collector.collect(ctx())
    api.fail(3, Field.POWER, "gpu_lost")
    caplog.set_level(logging.WARNING, logger="stepwatch.agents.collectors.nvml")
    for _ in range(3):
        msg = gpu_message(collector.collect(ctx()))
        assert msg.gpus[3].power_w is None
        assert msg.gpus[3].temp_gpu_c is not None  # the rest of the reading still came
        assert all(g.power_w is not None for g in msg.gpus if g.index != 3)
    health = collector.health()
    assert health.state is HealthState.DEGRADED
    assert health.errors_total == 3 and "gpu_lost" in health.last_error
    assert collector.error_counts() == {"gpu_lost": 3}
    assert len([r for r in caplog.records if "reading failed" in r.getMessage()]) == 1
    api.fail(3, Field.POWER, None)
    assert gpu_message(collector.collect(ctx())).gpus[3].power_w is not None
    assert collector.health().state is HealthState.OK


def test_nvml_missing_is_down_logged_once_and_retried(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    api = ReplayNvml.from_file(clock=clock, unavailable="library_not_found")
    collector = NvmlCollector(api, retry_ticks=5)
    caplog.set_level(logging.WARNING, logger="stepwatch.agents.collectors.nvml")
    for _ in range(5):
        assert collector.collect(ctx()) == []
        assert collector.health().state is HealthState.DOWN
    assert collector.health().errors_total == 1  # one failed attempt, four waits
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1
    api._unavailable = None  # the driver came up
    assert gpu_message(collector.collect(ctx())).gpus
    assert collector.health().state is HealthState.OK


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="NVML is installed here"
)
def test_real_nvml_without_library_is_down_not_raised() -> None:
    collector = NvmlCollector(RealNvml())
    assert collector.collect(ctx()) == []
    health = collector.health()
    assert health.state is HealthState.DOWN
    assert "library_not_found" in health.last_error
    collector.close()


def test_xid_event_path_via_fake_event_set(clock: Clock) -> None:
    api = ReplayNvml.from_file(clock=clock)
    collector = NvmlCollector(api)
    jobs = {i: "job-7" for i in range(8)}
    assert [m for m in collector.collect(ctx(jobs)) if isinstance(m, EventMessage)] == []
    api.inject_xid(4, 79)
    api.inject_xid(6, 48)
    messages = collector.collect(ctx(jobs))
    events = [m for m in messages if isinstance(m, EventMessage)]
    assert [(e.type, e.gpu, e.code) for e in events] == [
        (EventType.XID, 4, 79),
        (EventType.XID, 6, 48),
    ]
    assert events[0].job_id == "job-7" and events[0].host == "gpu-node-017"
    assert events[0].attrs["uuid"] == RAW["devices"][4]["static"]["uuid"]
    assert gpu_message(messages).gpus[4].xid_last == 79
    assert [m for m in collector.collect(ctx(jobs)) if isinstance(m, EventMessage)] == []


def test_recorded_xid_fires_once_at_its_offset(clock: Clock) -> None:
    collector = NvmlCollector(ReplayNvml.from_file(L40S, clock=clock))
    seen = []
    for _ in range(6):
        seen.append([m.code for m in collector.collect(ctx()) if isinstance(m, EventMessage)])
        clock.t += 1.0
    assert seen == [[], [], [13], [], [], []]


def test_event_wait_failure_degrades_but_readings_flow(clock: Clock) -> None:
    api = ReplayNvml.from_file(clock=clock)

    def broken(event_set: Any, timeout_ms: int) -> None:
        raise NvmlError("unknown", "event queue broken")

    api.wait_event = broken  # type: ignore[method-assign]
    collector = NvmlCollector(api)
    assert len(gpu_message(collector.collect(ctx())).gpus) == 8
    assert collector.health().state is HealthState.DEGRADED


def test_unexpected_exception_never_reaches_the_agent(clock: Clock) -> None:
    api = ReplayNvml.from_file(clock=clock)
    collector = NvmlCollector(api)
    collector.collect(ctx())

    def explode(handle: Any, field: Field) -> Any:
        raise RuntimeError("boom")

    api.read = explode  # type: ignore[method-assign]
    assert collector.collect(ctx()) == []
    assert collector.health().state is HealthState.DEGRADED
    collector.close()


def test_small_hand_recording_conversions(tmp_path: Path, clock: Clock) -> None:
    sample = {
        "power_usage_mw": 123_456,
        "enforced_power_limit_mw": 700_000,
        "memory": [10 * MIB, 6 * MIB, 16 * MIB],
        "nvlink_throughput_kib": [1, 2],
        "remapped_rows": [1, 2, 1, 0],
        "utilization": [7, 8],
    }
    rec = {
        "format": "stepwatch-nvml-recording",
        "version": 1,
        "interval_s": 1.0,
        "devices": [{"index": 0, "static": {"uuid": "GPU-x"}, "samples": [sample]}],
    }
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(rec))
    gpu = gpu_message(NvmlCollector(ReplayNvml.from_file(path, clock=clock)).collect(ctx())).gpus[0]
    assert (gpu.power_w, gpu.power_limit_w) == (123.456, 700.0)
    assert (gpu.fb_used_mib, gpu.fb_free_mib) == (10.0, 6.0)
    assert (gpu.nvlink_tx_bytes_total, gpu.nvlink_rx_bytes_total) == (1024, 2048)
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_uncorrectable) == (1, 2)
    assert gpu.remapped_rows_pending is True
    assert (gpu.util_gpu_pct, gpu.util_mem_pct) == (7.0, 8.0)
    assert gpu.name == "" and gpu.temp_gpu_c is None  # absent from the recording


def test_bad_recording_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other", "version": 1, "interval_s": 1, "devices": []}')
    with pytest.raises(ConfigError):
        load_recording(bad)
    with pytest.raises(ConfigError):
        load_recording(tmp_path / "missing.json")


def test_registry_builds_by_name_and_replay_env() -> None:
    settings = Settings.load(env={}, sysfs_root="/nonexistent")
    names = parse_names("nvml-replay, rdma,steps,dcgm,rdma")
    assert names == ["nvml-replay", "rdma", "steps", "dcgm"]
    collectors = build_host_collectors(settings, names)
    assert [c.name for c in collectors] == ["nvml-replay", "rdma", "dcgm"]  # steps: the agent's
    assert all(isinstance(c, Collector) for c in collectors)
    assert len(gpu_message(collectors[0].collect(ctx())).gpus) == 8  # shipped H100 recording
    from_env = Settings.load(env={"STEPWATCH_NVML_REPLAY": str(L40S)}, sysfs_root="/nonexistent")
    (replay,) = build_host_collectors(from_env, ["nvml-replay"])
    assert len(gpu_message(replay.collect(ctx())).gpus) == 2
    with pytest.raises(ConfigError, match="unknown collector"):
        build_host_collectors(settings, ["nvml", "gpu-magic"])
    for c in collectors:
        c.close()


def test_default_recording_ships_inside_the_package() -> None:
    data = importlib.resources.files("stepwatch.agents.collectors.data")
    assert data.joinpath("h100_8gpu.json").is_file()
    assert DEFAULT_RECORDING.parent.name == "data"
    recording = load_recording(DEFAULT_RECORDING)
    assert len(recording.devices) == 8 and recording.interval_s == 1.0
