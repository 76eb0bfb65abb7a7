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
from itertools import pairwise
from operator import attrgetter

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
ORDER_SLACK_S = 30.0  # port samples arrive at most this much out of event-time order
ERROR_COUNTERS = ("symbol_error_total", "link_downed_total", "link_error_recovery_total",
                  "rcv_errors_total", "local_link_integrity_errors_total")
ERROR_NAMES = tuple(c.removesuffix("_total") for c in ERROR_COUNTERS)
# every counter a network check reads, in one call: congestion, xmit_wait, errors
_COUNTERS_OF = attrgetter(*CONGESTION_COUNTERS, "xmit_wait_total", *ERROR_COUNTERS)


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

    def _ports_in(self, t0: float, t1: float) -> list[PortMessage]:
        """The port samples in [t0, t1] in time order, read from the newest back (samples
        arrive nearly in order: the scan stops ``ORDER_SLACK_S`` before ``t0``)."""
        out = []
        for m in reversed(self.port):
            if m.ts < t0 - ORDER_SLACK_S:
                break
            if t0 <= m.ts <= t1:
                out.append(m)
        out.sort(key=lambda m: m.ts)
        return out

    def _ends(self, t0: float, t1: float) -> tuple[PortMessage, PortMessage, int] | None:
        """The first and the last port sample in [t0, t1] and how many there are, read from
        the newest back (see :meth:`_ports_in`), without a list or a sort."""
        first = last = None
        n = 0
        for m in reversed(self.port):
            ts = m.ts
            if ts < t0 - ORDER_SLACK_S:
                break
            if t0 <= ts <= t1:
                n += 1
                if last is None or ts > last.ts:
                    last = m
                if first is None or ts < first.ts:
                    first = m
        return None if first is None or last is None else (first, last, n)

    def _ends_signals(self, t0: float, t1: float) -> list[PortSignals]:
        """:meth:`port_signals` from the window's first and last samples alone."""
        ends = self._ends(t0, t1)
        if ends is None:
            return []
        first, last, n = ends
        span = last.ts - first.ts
        downs = {(e.device, e.port) for e in self.events_in(t0, t1, EventType.LINK_STATE)
                 if "down" in (e.detail or "").lower()}
        before = {(p.device, p.port): p for p in first.ports}
        after = {(p.device, p.port): p for p in last.ports}
        out = []
        for key in sorted(before.keys() | after.keys()):
            p = after.get(key) or before[key]
            q = before.get(key, p)
            rise = _rises(_COUNTERS_OF(q), _COUNTERS_OF(p))
            cnp = rise[0] + rise[1] + rise[2]
            errors = {ERROR_NAMES[i]: v for i, v in enumerate(rise[4:]) if v}
            down = any(r.state not in ("", "ACTIVE") for r in (q, p) if r.state)
            out.append(PortSignals(
                device=p.device, port=p.port, samples=n,
                cnp_per_s=cnp / span if span > 0 else 0.0,
                xmit_wait_per_s=rise[3] / span if span > 0 else 0.0,
                errors=errors,
                down=down or key in downs or (p.device, None) in downs,
            ))
        return out

    def rise_start(self, device: str, port: int, t0: float, t1: float, level: float) -> float:
        """Start of the trailing run of sample intervals in [t0, t1] in which the port's
        congestion rate (ECN/CNP + xmit_wait, whichever ``level`` is in) stayed at or above
        ``level`` per second: when its rise began (``t1`` when the last one is below)."""
        pts: list[tuple[float, int]] = []
        for m in self.port:
            if t0 <= m.ts <= t1:
                for p in m.ports:
                    if p.device == device and p.port == port:
                        pts.append((m.ts, (p.xmit_wait_total or 0) + sum(
                            getattr(p, c) or 0 for c in CONGESTION_COUNTERS)))
        start = t1
        for (ta, a), (tb, b) in reversed(list(pairwise(pts))):
            if tb <= ta or (b - a) / (tb - ta) < level:
                break
            start = ta
        return start

    def port_signals(self, t0: float, t1: float, ends_only: bool = False) -> list[PortSignals]:
        """Rates and error increases of every port of the host over [t0, t1].

        ``ends_only`` (the periodic network checks): from the window's first and last
        samples alone, a link counted down from their states, link-down events and
        ``link_downed``; a counter reset inside the window then costs the window.
        """
        if ends_only:
            return self._ends_signals(t0, t1)
        msgs = self._ports_in(t0, t1)
        if not msgs:
            return []
        n = len(msgs)
        series: dict[tuple[str, int], list[PortReading]] = {}
        for m in msgs:
            for p in m.ports:
                key = (p.device, p.port)
                got = series.get(key)
                if got is None:
                    series[key] = [p]
                else:
                    got.append(p)
        span = msgs[-1].ts - msgs[0].ts
        downs = {(e.device, e.port) for e in self.events_in(t0, t1, EventType.LINK_STATE)
                 if "down" in (e.detail or "").lower()}
        out = []
        for (device, port), readings in sorted(series.items()):
            cnp = sum(_rise(readings, c) for c in CONGESTION_COUNTERS)
            errors = {c.removesuffix("_total"): v for c in ERROR_COUNTERS
                      if (v := _rise(readings, c))}
            down = any(p.state not in ("", "ACTIVE") for p in readings if p.state)
            out.append(PortSignals(
                device=device,
                port=port,
                samples=len(readings) if not ends_only else n,
                cnp_per_s=cnp / span if span > 0 else 0.0,
                xmit_wait_per_s=_rise(readings, "xmit_wait_total") / span if span > 0 else 0.0,
                errors=errors,
                down=down or (device, port) in downs or (device, None) in downs,
            ))
        return out


def _rises(a: tuple[int | None, ...], b: tuple[int | None, ...]) -> list[int]:
    """Increase of each counter from reading ``a`` to reading ``b`` (as :func:`_rise` for
    two readings: a reset or a 32-bit wrap is read as such, never as a negative)."""
    out = []
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            out.append(0)
        elif y >= x:
            out.append(y - x)
        else:
            out.append(delta(x, y, WRAP_32 if y < x < WRAP_32 else None) or 0)
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


def _rise(readings: list[PortReading], counter: str) -> int:
    """The increase of one cumulative counter over a port's readings: last - first when
    that is not negative (no reset or wrap between the ends; a reset followed by growth
    past the first value within one window would be undercounted, never negative), the
    sample-to-sample sum otherwise."""
    first, last = getattr(readings[0], counter), getattr(readings[-1], counter)
    if first is not None and last is not None and last >= first:
        return int(last - first)
    return _increase([getattr(p, counter) for p in readings])


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
