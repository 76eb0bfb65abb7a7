"""Per-GPU and per-port series of the agent's /metrics, and counted XID events.

The agent keeps the latest reading of every GPU and RDMA port of its host and
counts discrete events, so Prometheus rules can alert on the host itself (a
critical XID, double-bit ECC, throttling, a link down, congestion) without a
separate dcgm-exporter or node_exporter.

Names follow what users know. GPU series mirror dcgm-exporter's fields as
``stepwatch_gpu_*`` in base units with its labels ``gpu``, ``UUID`` and
``Hostname``; port series mirror node_exporter's InfiniBand collector as
``stepwatch_infiniband_*`` with ``host``, ``device`` and ``port``; RoCE
congestion counters (mlx5 ``hw_counters``) are ``stepwatch_roce_*``.

XIDs are *counted* (``stepwatch_gpu_xid_events_total{xid=...}``): dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS`` holds only the last XID and never resets, so an
``increase()`` over it misses a repeat and can fire forever. Cardinality is
bounded: GPUs and ports of one host, 8 throttle reasons, at most
``MAX_XIDS_PER_GPU`` distinct XID values per GPU (further ones count as
``xid="other"``), at most ``MAX_XID_GPUS`` GPUs (further ones count under
``gpu=""``). XIDs come from the agent's own collectors only: the socket refuses
a rank's ``xid``, ``ecc`` and ``link_state`` events (``host_fact``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    PortMessage,
    PortReading,
)

MAX_XID_GPUS = 64  # GPUs with XID series of their own; more count under gpu=""
MAX_XIDS_PER_GPU = 16
GPU_LABELS = ["gpu", "UUID", "Hostname"]
PORT_LABELS = ["host", "device", "port"]

# NVML clocks-event (throttle) reasons bitmask -> label value
THROTTLE_REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "power_brake",
}

MHZ = 1e6
MIB = 1048576.0
# (metric suffix, help, reading attribute, scale); gauges
GPU_GAUGES: list[tuple[str, str, str, float]] = [
    ("sm_clock_hertz", "SM clock (DCGM_FI_DEV_SM_CLOCK, in Hz).", "sm_clock_mhz", MHZ),
    ("sm_clock_max_hertz", "Maximum SM clock (NVML max clock, in Hz).", "sm_clock_max_mhz", MHZ),
    ("mem_clock_hertz", "Memory clock (DCGM_FI_DEV_MEM_CLOCK, in Hz).", "mem_clock_mhz", MHZ),
    ("temperature_celsius", "GPU temperature (DCGM_FI_DEV_GPU_TEMP).", "temp_gpu_c", 1.0),
    ("memory_temperature_celsius", "HBM temperature (DCGM_FI_DEV_MEMORY_TEMP).", "temp_mem_c", 1.0),
    ("power_watts", "Power draw (DCGM_FI_DEV_POWER_USAGE).", "power_w", 1.0),
    ("power_limit_watts", "Enforced power limit.", "power_limit_w", 1.0),
    (
        "utilization_ratio",
        "GPU utilisation 0..1 (DCGM_FI_DEV_GPU_UTIL / 100).",
        "util_gpu_pct",
        0.01,
    ),
    (
        "framebuffer_used_bytes",
        "Framebuffer memory used (DCGM_FI_DEV_FB_USED, in bytes).",
        "fb_used_mib",
        MIB,
    ),
    (
        "framebuffer_free_bytes",
        "Framebuffer memory free (DCGM_FI_DEV_FB_FREE, in bytes).",
        "fb_free_mib",
        MIB,
    ),
    (
        "tensor_active_ratio",
        "Tensor pipe active 0..1 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
        "tensor_active",
        1.0,
    ),
    (
        "remapped_rows_pending",
        "1 while a row remap waits for a GPU reset (DCGM_FI_DEV_ROW_REMAP_PENDING).",
        "remapped_rows_pending",
        1.0,
    ),
    (
        "row_remap_failure",
        "1 when a row remap failed: no spare rows left (DCGM_FI_DEV_ROW_REMAP_FAILURE).",
        "remapped_rows_failure",
        1.0,
    ),
]
# (metric suffix without _total, help, reading attribute); cumulative since driver load
GPU_COUNTERS: list[tuple[str, str, str]] = [
    (
        "ecc_single_bit_errors",
        "Corrected (single-bit) ECC errors, volatile total.",
        "ecc_sbe_total",
    ),
    (
        "ecc_double_bit_errors",
        "Uncorrected (double-bit) ECC errors, volatile total (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL).",
        "ecc_dbe_total",
    ),
    (
        "remapped_rows_correctable",
        "Rows remapped for correctable errors.",
        "remapped_rows_correctable",
    ),
    (
        "remapped_rows_uncorrectable",
        "Rows remapped for uncorrectable errors (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS).",
        "remapped_rows_uncorrectable",
    ),
    ("pcie_replay", "PCIe replays (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).", "pcie_replay_total"),
]
# (metric name without _total, help, reading attribute)
PORT_COUNTERS: list[tuple[str, str, str]] = [
    (
        "infiniband_port_data_transmitted_bytes",
        "Bytes sent (port_xmit_data x 4).",
        "xmit_bytes_total",
    ),
    (
        "infiniband_port_data_received_bytes",
        "Bytes received (port_rcv_data x 4).",
        "rcv_bytes_total",
    ),
    ("infiniband_port_packets_transmitted", "Packets sent.", "xmit_packets_total"),
    ("infiniband_port_packets_received", "Packets received.", "rcv_packets_total"),
    (
        "infiniband_port_transmit_wait",
        "Ticks with data queued but not sent (port_xmit_wait): congestion.",
        "xmit_wait_total",
    ),
    ("infiniband_symbol_error", "Minor link errors (symbol_error).", "symbol_error_total"),
    ("infiniband_link_downed", "Times the link went down (link_downed).", "link_downed_total"),
    (
        "infiniband_link_error_recovery",
        "Successful link error recoveries.",
        "link_error_recovery_total",
    ),
    (
        "infiniband_port_errors_received",
        "Received packets with errors (port_rcv_errors).",
        "rcv_errors_total",
    ),
    (
        "infiniband_port_receive_remote_physical_errors",
        "Packets marked bad by the remote end.",
        "rcv_remote_physical_errors_total",
    ),
    (
        "infiniband_port_discards_transmitted",
        "Packets discarded on send (port_xmit_discards).",
        "xmit_discards_total",
    ),
    (
        "infiniband_excessive_buffer_overrun_errors",
        "Buffer overruns.",
        "excessive_buffer_overrun_errors_total",
    ),
    (
        "infiniband_local_link_integrity_errors",
        "Local link integrity errors.",
        "local_link_integrity_errors_total",
    ),
    (
        "roce_np_cnp_sent",
        "CNPs sent by this port as notification point (np_cnp_sent).",
        "np_cnp_sent_total",
    ),
    (
        "roce_np_ecn_marked_roce_packets",
        "ECN-marked RoCE packets received.",
        "np_ecn_marked_roce_packets_total",
    ),
    (
        "roce_rp_cnp_handled",
        "CNPs handled as reaction point (rp_cnp_handled): this port was told to slow down.",
        "rp_cnp_handled_total",
    ),
    ("roce_out_of_sequence", "Out-of-sequence packets received.", "out_of_sequence_total"),
    (
        "roce_local_ack_timeout_err",
        "Local ACK timeouts (retransmits).",
        "local_ack_timeout_err_total",
    ),
]


STALE_TICKS = 3  # ticks' time without a reading after which the last one is not exported


@dataclass(frozen=True)
class SeriesView:
    """An immutable copy of the host's latest readings and event counts."""

    gpus: tuple[GpuReading, ...] = ()
    ports: tuple[PortReading, ...] = ()
    xids: dict[tuple[int, str], int] = field(default_factory=dict)  # (gpu, xid) -> events
    link_events: dict[tuple[str, int], int] = field(default_factory=dict)  # (device, port) -> n


class HostSeries:
    """Fed every tick's messages by the agent; read at scrape time via :meth:`view`.

    GPU and port readings are the last ones a tick brought; once they are older than
    ``stale_seconds`` on ``clock`` (the collector failing, NVML gone, or a tick stuck in a
    hung driver call and so bringing nothing at all) a scrape shows no series rather
    than the last temperature forever."""

    def __init__(
        self,
        stale_seconds: float = STALE_TICKS + 1.0,  # at 1 s ticks; the agent passes its own
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self.stale_seconds = stale_seconds
        self._clock = clock
        self._gpus: tuple[GpuReading, ...] = ()
        self._ports: tuple[PortReading, ...] = ()
        self._gpu_at = self._port_at = 0.0  # when the readings came (clock)
        self._xids: Counter[tuple[int, str]] = Counter()
        self._xid_kinds: Counter[int] = Counter()  # XID values kept per GPU
        self._links: Counter[tuple[str, int]] = Counter()

    def observe(self, messages: Iterable[object]) -> None:
        """One tick's messages."""
        with self._lock:
            for m in messages:
                if isinstance(m, GpuMessage):
                    self._gpus, self._gpu_at = tuple(m.gpus), self._clock()
                elif isinstance(m, PortMessage):
                    self._ports, self._port_at = tuple(m.ports), self._clock()
                elif isinstance(m, EventMessage):
                    self._event(m)

    def _event(self, m: EventMessage) -> None:
        if m.type is EventType.XID and m.code is not None:
            gpu = -1 if m.gpu is None else m.gpu
            if gpu not in self._xid_kinds and len(self._xid_kinds) >= MAX_XID_GPUS:
                gpu = -1  # series per GPU are bounded as the XID values per GPU are
            xid = str(m.code)
            if (gpu, xid) not in self._xids and self._xid_kinds[gpu] >= MAX_XIDS_PER_GPU - 1:
                xid = "other"
            if (gpu, xid) not in self._xids:
                self._xid_kinds[gpu] += 1
            self._xids[(gpu, xid)] += 1
        elif m.type is EventType.LINK_STATE and m.device is not None:
            self._links[(m.device, m.port or 1)] += 1

    def view(self) -> SeriesView:
        with self._lock:
            now = self._clock()
            gpus = self._gpus if now - self._gpu_at <= self.stale_seconds else ()
            ports = self._ports if now - self._port_at <= self.stale_seconds else ()
            return SeriesView(gpus, ports, dict(self._xids), dict(self._links))


def families(host: str, view: SeriesView) -> Iterator[Metric]:
    """Every per-GPU and per-port metric family of ``view`` that has samples."""
    for fam in (*_gpu_families(host, view), *_port_families(host, view)):
        if fam.samples:
            yield fam


def _gpu_families(host: str, view: SeriesView) -> Iterator[Metric]:
    uuids = {g.index: g.uuid for g in view.gpus}
    for suffix, doc, attr, scale in GPU_GAUGES:
        fam = GaugeMetricFamily(f"stepwatch_gpu_{suffix}", doc, labels=GPU_LABELS)
        for g in view.gpus:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric([str(g.index), g.uuid, host], float(value) * scale)
        yield fam
    for suffix, doc, attr in GPU_COUNTERS:
        cnt = CounterMetricFamily(f"stepwatch_gpu_{suffix}", doc, labels=GPU_LABELS)
        for g in view.gpus:
            value = getattr(g, attr)
            if value is not None:
                cnt.add_metric([str(g.index), g.uuid, host], float(value))
        yield cnt
    throttle = GaugeMetricFamily(
        "stepwatch_gpu_clocks_event_active",
        "1 while the NVML clocks-event (throttle) reason is "
        "set (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, one series per reason).",
        labels=[*GPU_LABELS, "reason"],
    )
    for g in view.gpus:
        if g.throttle_reasons is None:
            continue
        for bit, reason in THROTTLE_REASONS.items():
            throttle.add_metric(
                [str(g.index), g.uuid, host, reason], 1.0 if g.throttle_reasons & bit else 0.0
            )
    yield throttle
    xids = CounterMetricFamily(
        "stepwatch_gpu_xid_events",
        "XID events counted per GPU and XID (use increase(); "
        "unlike DCGM_FI_DEV_XID_ERRORS this is a true counter).",
        labels=[*GPU_LABELS, "xid"],
    )
    for (gpu, xid), n in sorted(view.xids.items()):
        xids.add_metric(["" if gpu < 0 else str(gpu), uuids.get(gpu, ""), host, xid], float(n))
    yield xids


def _port_families(host: str, view: SeriesView) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "stepwatch_infiniband_port_up",
        "1 when the port is ACTIVE and its physical link LinkUp.",
        labels=PORT_LABELS,
    )
    rate = GaugeMetricFamily(
        "stepwatch_infiniband_rate_bytes_per_second", "Link rate.", labels=PORT_LABELS
    )
    for p in view.ports:
        labels = [host, p.device, str(p.port)]
        if p.state or p.phys_state:
            up.add_metric(labels, 1.0 if _port_up(p) else 0.0)
        if p.rate_gbps is not None:
            rate.add_metric(labels, p.rate_gbps * 1e9 / 8)
    yield up
    yield rate
    for name, doc, attr in PORT_COUNTERS:
        fam = CounterMetricFamily(f"stepwatch_{name}", doc, labels=PORT_LABELS)
        for p in view.ports:
            value = getattr(p, attr)
            if value is not None:
                fam.add_metric([host, p.device, str(p.port)], float(value))
        yield fam
    changes = CounterMetricFamily(
        "stepwatch_infiniband_link_state_changes",
        "Link state changes the agent saw between ticks.",
        labels=PORT_LABELS,
    )
    for (device, port), n in sorted(view.link_events.items()):
        changes.add_metric([host, device, str(port)], float(n))
    yield changes


def _port_up(p: PortReading) -> bool:
    state = p.state.upper()
    phys = p.phys_state.replace(" ", "").lower()
    return "ACTIVE" in state and (not phys or "linkup" in phys)
