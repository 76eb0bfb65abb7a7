"""A short window of each host's GPU and port samples and discrete events.

Ingest is an append to a bounded deque; the work happens only when a
detection asks for the signals of one GPU or one host over a time range
(:meth:`HostWindow.gpu_signals`, :meth:`HostWindow.port_signals`). Counters are
cumulative: increases are summed sample to sample with
:func:`stepwatch.contract.counters.delta`, so a reset in the window costs at
most one interval, never a negative or a huge rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    PortMessage,
    PortReading,
)
from stepwatch.contract.counters import WRAP_32, delta

# Throttle (clocks-event) reasons that mean the GPU is slowed by something wrong.
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
POWER_BRAKE = 0x80
SW_POWER_CAP = 0x4
BAD_THROTTLE = HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | POWER_BRAKE
THROTTLE_NAMES = {  # most severe first: the first one found leads the summary
    HW_SLOWDOWN: "HwSlowdown",
    HW_THERMAL: "HwThermal",
    POWER_BRAKE: "PowerBrake",
    SW_THERMAL: "SwThermal",
    SW_POWER_CAP: "SwPowerCap",
}
CONGESTION_COUNTERS = ("np_cnp_sent_total", "rp_cnp_handled_total",
                       "np_ecn_marked_roce_packets_total")
ERROR_COUNTERS = ("symbol_error_total", "link_downed_total", "link_error_recovery_total",
                  "rcv_errors_total", "local_link_integrity_errors_total")


@dataclass(frozen=True, slots=True)
class GpuSignals:
    samples: int
    throttle_share: dict[int, float]  # reason bit -> share of samples with it set
    sm_clock_ratio: float | None  # median SM clock / max SM clock
    sm_clock_ratio_low: float | None  # its 25th percentile (a drop in part of the window)
    temp_c: float | None  # median GPU temperature
    power_ratio: float | None  # median power / power limit
    util_pct: float | None  # median GPU utilisation
    ecc_dbe: int  # double-bit ECC errors counted in the range
    remapped_uncorrectable: int
    xids: tuple[int, ...]  # XID codes seen for this GPU (or its host, GPU unknown)


@dataclass(frozen=True, slots=True)
class PortSignals:
    device: str
    port: int
    samples: int
    cnp_per_s: float  # CNPs sent + handled, plus ECN-marked packets, per second
    xmit_wait_per_s: float
    errors: dict[str, int]  # error counter -> increase in the range
    down: bool  # state seen other than ACTIVE, or a link-down event


@dataclass(frozen=True, slots=True)
class LinkIncident:
    """A NIC link went down (or flapped between two samples), or came back up."""

    host: str
    device: str
    port: int | None
    ts: float
    down: bool
    how: str  # "event ACTIVE->DOWN", "state DOWN", "link_downed +1", ...


@dataclass
class HostWindow:
    host: str
    size: int
    gpu: deque[GpuMessage] = field(init=False)
    port: deque[PortMessage] = field(init=False)
    events: deque[EventMessage] = field(init=False)
    gpu_names: dict[int, str] = field(default_factory=dict)
    last_seen: float = 0.0
    links: dict[tuple[str, int], tuple[str, int | None]] = field(default_factory=dict)
    _port_sig: list[tuple[str, int, str, int | None]] | None = None  # last port states seen

    def __post_init__(self) -> None:
        self.gpu = deque(maxlen=self.size)
        self.port = deque(maxlen=self.size)
        self.events = deque(maxlen=self.size)

    def add(self, message: GpuMessage | PortMessage | EventMessage) -> list[LinkIncident]:
        """Keep the sample; return link changes it reveals (rare)."""
        if message.ts > self.last_seen:
            self.last_seen = message.ts
        if isinstance(message, GpuMessage):
            self.gpu.append(message)
            if len(self.gpu_names) < len(message.gpus):
                for g in message.gpus:
                    if g.name:
                        self.gpu_names[g.index] = g.name
            return []
        if isinstance(message, PortMessage):
            self.port.append(message)
            return self._link_changes(message)
        self.events.append(message)
        if message.type == EventType.LINK_STATE and message.device:
            state = str(message.attrs.get("state") or message.detail.rsplit("->", 1)[-1])
            up = state.strip().upper() == "ACTIVE"
            return [LinkIncident(self.host, message.device, message.port, message.ts, not up,
                                 f"event {message.detail or state}")]
        return []

    def _link_changes(self, message: PortMessage) -> list[LinkIncident]:
        sig = [(p.device, p.port, p.state, p.link_downed_total) for p in message.ports]
        if sig == self._port_sig:
            return []  # every port as in the last sample: no change to find, links as they are
        # the shortcut holds only when each port appears once (then ``links`` holds ``sig``)
        self._port_sig = sig if len({(d, n) for d, n, _, _ in sig}) == len(sig) else None
        out: list[LinkIncident] = []
        for p in message.ports:
            key = (p.device, p.port)
            state = p.state or "ACTIVE"
            prev = self.links.get(key)
            self.links[key] = (state, p.link_downed_total)
            if prev is None:
                if state != "ACTIVE":
                    out.append(LinkIncident(self.host, p.device, p.port, message.ts, True,
                                            f"state {state}"))
                continue
            was, downed = prev
            if state != was:
                out.append(LinkIncident(self.host, p.device, p.port, message.ts,
                                        state != "ACTIVE", f"state {was}->{state}"))
            elif state == "ACTIVE" and downed is not None and p.link_downed_total is not None \
                    and p.link_downed_total > downed:
                how = f"link_downed +{p.link_downed_total - downed}"
                out.append(LinkIncident(self.host, p.device, p.port, message.ts, True, how))
                out.append(LinkIncident(self.host, p.device, p.port, message.ts, False, how))
        return out

    def events_in(self, t0: float, t1: float, *types: EventType) -> list[EventMessage]:
        return [e for e in self.events if t0 <= e.ts <= t1 and (not types or e.type in types)]

    def gpu_signals(self, t0: float, t1: float) -> dict[int, GpuSignals]:
        """Signals of every GPU of the host from samples and events in [t0, t1]."""
        readings: dict[int, list[GpuReading]] = {}
        for m in self.gpu:
            if t0 <= m.ts <= t1:
                for g in m.gpus:
                    readings.setdefault(g.index, []).append(g)
        events = self.events_in(t0, t1, EventType.XID, EventType.ECC)
        out = {}
        for index in set(readings) | {e.gpu for e in events if e.gpu is not None}:
            out[index] = _gpu_signals(readings.get(index, []), [
                e for e in events if e.gpu is None or e.gpu == index
            ])
        return out

    def port_signals(self, t0: float, t1: float) -> list[PortSignals]:
        """Rates and error increases of every port of the host over [t0, t1]."""
        series: dict[tuple[str, int], list[tuple[float, PortReading]]] = {}
        for m in self.port:
            if t0 <= m.ts <= t1:
                for p in m.ports:
                    series.setdefault((p.device, p.port), []).append((m.ts, p))
        downs = {(e.device, e.port) for e in self.events_in(t0, t1, EventType.LINK_STATE)
                 if "down" in (e.detail or "").lower()}
        out = []
        for (device, port), samples in sorted(series.items()):
            span = samples[-1][0] - samples[0][0]
            readings = [p for _, p in samples]
            cnp = sum(_increase([getattr(p, c) for p in readings]) for c in CONGESTION_COUNTERS)
            wait = _increase([p.xmit_wait_total for p in readings])
            errors = {c.removesuffix("_total"): _increase([getattr(p, c) for p in readings])
                      for c in ERROR_COUNTERS}
            down = any(getattr(p, "state", "ACTIVE") not in ("", "ACTIVE") for p in readings)
            down = down or (device, port) in downs or (device, None) in downs
            out.append(PortSignals(
                device=device,
                port=port,
                samples=len(readings),
                cnp_per_s=cnp / span if span > 0 else 0.0,
                xmit_wait_per_s=wait / span if span > 0 else 0.0,
                errors={k: v for k, v in errors.items() if v},
                down=down,
            ))
        return out


def _gpu_signals(readings: list[GpuReading], events: list[EventMessage]) -> GpuSignals:
    xids = tuple(int(e.code) for e in events if e.type == EventType.XID and e.code is not None)
    dbe_events = sum(1 for e in events if e.type == EventType.ECC and is_dbe(e))
    n = len(readings)
    if not n:
        return GpuSignals(0, {}, None, None, None, None, None, dbe_events, 0, xids)
    reasons = [r.throttle_reasons or 0 for r in readings]
    seen = 0
    for x in reasons:
        seen |= x
    share = {bit: (sum(1 for x in reasons if x & bit) / n if seen & bit else 0.0)
             for bit in THROTTLE_NAMES}  # a bit no sample has: 0 without a pass
    clocks = [r.sm_clock_mhz / r.sm_clock_max_mhz for r in readings
              if r.sm_clock_mhz is not None and r.sm_clock_max_mhz]
    power = [r.power_w / r.power_limit_w for r in readings
             if r.power_w is not None and r.power_limit_w]
    return GpuSignals(
        samples=n,
        throttle_share=share,
        sm_clock_ratio=median_of(clocks),
        sm_clock_ratio_low=sorted(clocks)[len(clocks) // 4] if clocks else None,
        temp_c=median_of([r.temp_gpu_c for r in readings if r.temp_gpu_c is not None]),
        power_ratio=median_of(power),
        util_pct=median_of([r.util_gpu_pct for r in readings if r.util_gpu_pct is not None]),
        ecc_dbe=_increase([r.ecc_dbe_total for r in readings]) + dbe_events,
        remapped_uncorrectable=_increase([r.remapped_rows_uncorrectable for r in readings]),
        xids=xids,
    )


def is_dbe(e: EventMessage) -> bool:
    text = (e.detail or "").lower()
    return "dbe" in text or "double" in text


def _increase(values: list[int | None]) -> int:
    """Sum of sample-to-sample increases of a cumulative counter (resets handled)."""
    total = 0
    prev: int | None = None
    for v in values:
        if v is None:
            continue
        if prev is not None:
            # a decrease from the top quarter of 32 bits is a 32-bit counter wrapping
            wrap = WRAP_32 if v < prev < WRAP_32 else None
            total += delta(prev, v, wrap) or 0
        prev = v
    return total


def median_of(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2
