"""Per-GPU and per-port series on the agent's /metrics, and counted XID events."""

from __future__ import annotations

from pathlib import Path

from stepwatch.agents.agent import Agent
from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.rdma import RdmaCollector
from stepwatch.agents.host_series import MAX_XID_GPUS, MAX_XIDS_PER_GPU, HostSeries
from stepwatch.agents.metrics import registry_for, render
from stepwatch.contract import EventMessage, EventType, GpuMessage, GpuReading, Message
from stepwatch.settings import Settings
from tests.support import paths
from tests.support.host_metrics import render_series, samples, value

SYSFS = paths.FIXTURES / "sysfs"


def xid(code: int, gpu: int = 3) -> EventMessage:
    return EventMessage(host="node01", ts=1.0, type=EventType.XID, gpu=gpu, code=code)


def gpu_message() -> GpuMessage:
    return GpuMessage(
        host="node01",
        ts=1.0,
        gpus=[
            GpuReading(
                index=0,
                uuid="GPU-a",
                sm_clock_mhz=1410,
                sm_clock_max_mhz=1980,
                temp_gpu_c=91,
                power_w=699.5,
                throttle_reasons=0x40 | 0x4,
                ecc_dbe_total=2,
                remapped_rows_uncorrectable=1,
                remapped_rows_pending=True,
            ),
            GpuReading(index=3, uuid="GPU-d", sm_clock_mhz=1980),
        ],
    )


class Scripted:
    name = "scripted"

    def __init__(self, batches: list[list[Message]]) -> None:
        self.batches = batches

    def collect(self, ctx: HostContext) -> list[Message]:
        return self.batches.pop(0) if self.batches else []

    def health(self):
        from stepwatch.agents.collectors.base import CollectorHealth, HealthState

        return CollectorHealth(HealthState.OK)

    def close(self) -> None:
        pass


def test_gpu_series_use_dcgm_labels_and_base_units() -> None:
    series = HostSeries()
    series.observe([gpu_message()])
    text = render_series(series)
    labels = {"gpu": "0", "UUID": "GPU-a", "Hostname": "node01"}
    assert value(text, "stepwatch_gpu_sm_clock_hertz", **labels) == 1410e6
    assert value(text, "stepwatch_gpu_temperature_celsius", **labels) == 91
    assert value(text, "stepwatch_gpu_ecc_double_bit_errors_total", **labels) == 2
    assert value(text, "stepwatch_gpu_remapped_rows_pending", **labels) == 1
    assert value(text, "stepwatch_gpu_clocks_event_active", reason="hw_thermal", **labels) == 1
    assert value(text, "stepwatch_gpu_clocks_event_active", reason="sw_power_cap", **labels) == 1
    assert value(text, "stepwatch_gpu_clocks_event_active", reason="hw_slowdown", **labels) == 0
    # GPU 3 reports no throttle bitmask: no throttle series rather than a false 0
    assert value(text, "stepwatch_gpu_clocks_event_active", gpu="3", reason="hw_thermal") is None


def test_xids_are_counted_not_last_value_and_bounded() -> None:
    series = HostSeries()
    series.observe([gpu_message(), xid(79), xid(79), xid(48, gpu=0)])
    text = render_series(series)
    assert value(text, "stepwatch_gpu_xid_events_total", gpu="3", xid="79", UUID="GPU-d") == 2
    assert value(text, "stepwatch_gpu_xid_events_total", gpu="0", xid="48") == 1
    series.observe([xid(100 + i) for i in range(3 * MAX_XIDS_PER_GPU)])
    text = render_series(series)
    per_gpu3 = [
        k
        for k in samples(text)
        if k[0] == "stepwatch_gpu_xid_events_total" and ("gpu", "3") in k[1]
    ]
    assert len(per_gpu3) == MAX_XIDS_PER_GPU
    assert value(text, "stepwatch_gpu_xid_events_total", gpu="3", xid="other") > 0


def test_xid_series_are_bounded_in_gpus_too() -> None:
    """A new GPU index with each XID: 46,836 series and a 2.2 s tick in 25 s (red team)."""
    series = HostSeries()
    series.observe([xid(79, gpu=g) for g in range(20 * MAX_XID_GPUS)])
    keys = [k for k in samples(render_series(series)) if k[0] == "stepwatch_gpu_xid_events_total"]
    assert len(keys) == MAX_XID_GPUS + 1  # the last one: gpu=""
    assert value(render_series(series), "stepwatch_gpu_xid_events_total", gpu="", xid="79") == (
        19 * MAX_XID_GPUS
    )


def test_ports_from_a_real_sysfs_tree_use_node_exporter_names() -> None:
    ctx = HostContext("node01", 1.0, {})
    series = HostSeries()
    series.observe(RdmaCollector(str(SYSFS)).collect(ctx))
    text = render_series(series)
    labels = {"host": "node01", "device": "mlx5_0", "port": "1"}
    assert value(text, "stepwatch_infiniband_port_up", **labels) == 1
    assert value(text, "stepwatch_infiniband_rate_bytes_per_second", **labels) == 50e9
    raw = int((SYSFS / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").read_text())
    assert (
        value(text, "stepwatch_infiniband_port_data_transmitted_bytes_total", **labels) == 4 * raw
    )
    assert value(text, "stepwatch_infiniband_symbol_error_total", **labels) is not None
    assert value(text, "stepwatch_infiniband_port_transmit_wait_total", **labels) is not None
    assert any(k[0] == "stepwatch_roce_np_cnp_sent_total" for k in samples(text))


def test_agent_exports_what_its_collectors_read(tmp_path: Path) -> None:
    settings = Settings.load(env={}, host="node01", collectors="", spool_dir=str(tmp_path))

    class Sink:
        def send(self, messages):
            pass

        def flush(self, timeout):
            return 0

        def close(self, timeout=0):
            pass

    agent = Agent(settings, [Scripted([[gpu_message(), xid(79)], [xid(79)]])], Sink())
    agent.tick()
    agent.tick()
    text = render(registry_for(agent.snapshot, process=False))
    assert value(text, "stepwatch_gpu_xid_events_total", gpu="3", xid="79") == 2
    assert value(text, "stepwatch_agent_up") == 1


def test_readings_are_dropped_once_the_collector_stops_bringing_them() -> None:
    """Before: after NVML failed, the last temperature and utilisation stayed exported
    for good, with no timestamp: a dead collector looked like a healthy GPU. Their age is
    time, not ticks: a tick stuck in a hung driver call brings no tick at all."""
    now = [100.0]
    series = HostSeries(stale_seconds=3.0, clock=lambda: now[0])
    series.observe([gpu_message()])
    labels = {"gpu": "0", "UUID": "GPU-a", "Hostname": "node01"}
    for _ in range(3):
        now[0] += 1.0  # no tick, or ticks in which the collector returned nothing
        assert value(render_series(series), "stepwatch_gpu_temperature_celsius", **labels) == 91
    now[0] += 0.5
    assert value(render_series(series), "stepwatch_gpu_temperature_celsius", **labels) is None
    series.observe([gpu_message()])  # back: exported again
    assert value(render_series(series), "stepwatch_gpu_temperature_celsius", **labels) == 91
