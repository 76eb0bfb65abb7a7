"""A short window of each host's GPU and port samples and discrete events.

Ingest writes the fields the causes read into fixed-size NumPy rings
(:mod:`stepwatch.streams.core.hostsamples`; events, rare, stay messages in a
bounded deque); the work happens only when a detection asks for the signals of
one GPU or one host over a time range (:meth:`HostWindow.gpu_signals`,
:meth:`HostWindow.port_signals`). Counters are
cumulative: increases are summed sample to sample with
:func:`stepwatch.contract.counters.delta`, so a reset in the window costs at
most one interval, never a negative or a huge rate.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, cast

import msgspec
import numpy as np

from stepwatch.contract import EventMessage, EventType, GpuMessage, PortMessage
from stepwatch.contract.counters import WRAP_32, WRAPPING, delta
from stepwatch.streams.core.hostsamples import (
    ABSENT,
    GPU_FLOATS,
    PORT_INTS,
    HostStores,
    SampleView,
    gpu_rows,
    port_rows,
    port_sig,
    port_slots,
)

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
CONGESTION_COUNTERS = (
    "np_cnp_sent_total",
    "rp_cnp_handled_total",
    "np_ecn_marked_roce_packets_total",
)
ORDER_SLACK_S = 30.0  # port samples arrive at most this much out of event-time order
ERROR_COUNTERS = (
    "symbol_error_total",
    "link_downed_total",
    "link_error_recovery_total",
    "rcv_errors_total",
    "local_link_integrity_errors_total",
)
ERROR_NAMES = tuple(c.removesuffix("_total") for c in ERROR_COUNTERS)


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


log = logging.getLogger(__name__)

# a host's window and a time range on that window's clock (the batched readers' input)
View = tuple["HostWindow", float, float]
# distinct (device, port) a host may have; a real one has a few dozen at most. Its link
# states and port names are kept for as long as the host reports, so without a bound a
# sender that named fresh ports in every message grew the worker's memory for good
# (5,000 new ports a message: 937 MiB after 400 messages)
MAX_PORT_KEYS = 256


@dataclass
class HostWindow:
    host: str
    size: int
    stores: HostStores | None = None  # the engine's sample stores (None: the window's own)
    gpu: SampleView = field(init=False)  # GPU_FLOATS, GPU_INTS per reading
    port: SampleView = field(init=False)  # PORT_INTS per reading
    events: deque[EventMessage] = field(init=False)  # the host's hardware: XID, ECC, link
    # ranks' exceptions, per job (one job's cannot push another's out), the last
    # MAX_EXCEPTION_JOBS jobs to raise on the host
    exceptions: OrderedDict[str, deque[EventMessage]] = field(default_factory=OrderedDict)
    gpu_names: dict[int, str] = field(default_factory=dict)
    last_seen: float = 0.0
    links: dict[tuple[str, int], tuple[str, int | None]] = field(default_factory=dict)
    _port_sig: list[tuple[str, int, str, int | None]] | None = None  # last port states seen
    _port_keys: dict[tuple[str, int], int] = field(default_factory=dict)  # (device, port) -> id
    _key_names: list[tuple[str, int]] = field(default_factory=list)  # id -> (device, port)
    _slots_sig: list[tuple[Any, ...]] | None = None  # port_sig of the last port sample ...
    _slots: list[tuple[int, int]] = field(default_factory=list)  # ... and its port_slots
    ports_dropped: int = 0  # readings of ports beyond MAX_PORT_KEYS, not kept

    def __post_init__(self) -> None:
        stores = self.stores if self.stores is not None else HostStores(self.size)
        self.gpu = stores.gpu.view(stores.gpu.open())
        self.port = stores.port.view(stores.port.open())
        self.events = deque(maxlen=self.size)

    def close(self) -> None:
        """The host is forgotten: give its sample slots back."""
        self.gpu.store.close(self.gpu.slot)
        self.port.store.close(self.port.slot)

    def add(self, message: GpuMessage | PortMessage | EventMessage) -> list[LinkIncident]:
        """Keep the sample; return link changes it reveals (rare)."""
        if message.ts > self.last_seen:
            self.last_seen = message.ts
        if isinstance(message, GpuMessage):
            self.gpu.store.add(self.gpu.slot, message.ts, gpu_rows(message.gpus))
            if len(self.gpu_names) < len(message.gpus):
                for g in message.gpus:
                    if g.name:
                        self.gpu_names[g.index] = g.name
            return []
        if isinstance(message, PortMessage):
            if len(self._port_keys) + len(message.ports) > MAX_PORT_KEYS:
                message = self._known_ports(message)  # rare: a new port could exceed it
            sig = port_sig(message.ports)
            port = self.port
            if sig == self._slots_sig:  # the ports and their states as in the last sample
                port.store.add(port.slot, message.ts, port_rows(message.ports, self._slots))
                if self._port_sig is self._slots_sig:
                    return []  # ... whose links were read then (see _link_changes)
                return self._link_changes(message, sig)
            self._slots = port_slots(sig, self._port_keys)  # changed: look them up again
            self._slots_sig = sig
            port.store.add(port.slot, message.ts, port_rows(message.ports, self._slots))
            return self._link_changes(message, sig)
        if message.type == EventType.EXCEPTION:
            self._exception(_slim(message))
            return []
        if message.type not in HOST_EVENTS:
            return []  # a job's own event (checkpoint, restart, start, end): none read here
        self.events.append(_slim(message))
        if message.type == EventType.LINK_STATE and message.device:
            state = str(message.attrs.get("state") or message.detail.rsplit("->", 1)[-1])
            up = state.strip().upper() == "ACTIVE"
            return [
                LinkIncident(
                    self.host,
                    message.device,
                    message.port,
                    message.ts,
                    not up,
                    f"event {message.detail or state}",
                )
            ]
        return []

    def _known_ports(self, message: PortMessage) -> PortMessage:
        """The message's readings of known ports, and of new ones while fewer than
        ``MAX_PORT_KEYS`` are known; the rest are counted and dropped."""
        keys, kept = self._port_keys, []
        fresh: set[tuple[str, int]] = set()
        for p in message.ports:
            key = (p.device, p.port)
            if key in keys or key in fresh or len(keys) + len(fresh) < MAX_PORT_KEYS:
                if key not in keys:
                    fresh.add(key)
                kept.append(p)
        dropped = len(message.ports) - len(kept)
        if dropped:
            if not self.ports_dropped:
                log.warning(
                    "host reports more ports than kept host=%s limit=%d", self.host, MAX_PORT_KEYS
                )
            self.ports_dropped += dropped
        return msgspec.structs.replace(message, ports=kept)

    def _link_changes(self, message: PortMessage, sig: list[tuple[Any, ...]]) -> list[LinkIncident]:
        """``sig``: the ``port_sig`` tuple of each port of the message."""
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
                    out.append(
                        LinkIncident(
                            self.host, p.device, p.port, message.ts, True, f"state {state}"
                        )
                    )
                continue
            was, downed = prev
            if state != was:
                out.append(
                    LinkIncident(
                        self.host,
                        p.device,
                        p.port,
                        message.ts,
                        state != "ACTIVE",
                        f"state {was}->{state}",
                    )
                )
            elif (
                state == "ACTIVE"
                and downed is not None
                and p.link_downed_total is not None
                and p.link_downed_total > downed
            ):
                how = f"link_downed +{p.link_downed_total - downed}"
                out.append(LinkIncident(self.host, p.device, p.port, message.ts, True, how))
                out.append(LinkIncident(self.host, p.device, p.port, message.ts, False, how))
        return out

    def _exception(self, message: EventMessage) -> None:
        job = message.job_id or ""
        kept = self.exceptions.get(job)
        if kept is None:
            kept = self.exceptions[job] = deque(maxlen=self.size)
            while len(self.exceptions) > MAX_EXCEPTION_JOBS:
                self.exceptions.popitem(last=False)
        else:
            self.exceptions.move_to_end(job)
        kept.append(message)

    def events_in(self, t0: float, t1: float, *types: EventType) -> list[EventMessage]:
        """The kept events of ``types`` (none: all) in [t0, t1], hardware first."""
        out = [e for e in self.events if t0 <= e.ts <= t1 and (not types or e.type in types)]
        if not types or EventType.EXCEPTION in types:
            for kept in self.exceptions.values():
                out.extend(e for e in kept if t0 <= e.ts <= t1)
        return out

    def gpu_signals(self, t0: float, t1: float) -> dict[int, GpuSignals]:
        """Signals of every GPU of the host from samples and events in [t0, t1]."""
        ring = self.gpu
        rows = _in_range(ring, t0, t1)
        readings = _series_by_gpu(ring.floats[rows], ring.ints[rows]) if rows else {}
        events = self.events_in(t0, t1, EventType.XID, EventType.ECC)
        out = {}
        for index in set(readings) | {e.gpu for e in events if e.gpu is not None}:
            out[index] = _gpu_signals(
                readings.get(index, _GpuSeries()),
                [e for e in events if e.gpu is None or e.gpu == index],
            )
        return out

    def _ports_in(self, t0: float, t1: float) -> list[int]:
        """The rows of the port samples in [t0, t1] in time order, read from the newest back
        (samples arrive nearly in order: the scan stops ``ORDER_SLACK_S`` before ``t0``;
        samples of equal time stay newest first)."""
        newest_first = self.port.order()[::-1]
        ts = self.port.ts
        t = ts[newest_first]
        old = np.flatnonzero(t < t0 - ORDER_SLACK_S)
        if len(old):
            newest_first, t = newest_first[: old[0]], t[: old[0]]
        rows = newest_first[(t0 <= t) & (t <= t1)]
        return cast("list[int]", rows[np.argsort(ts[rows], kind="stable")].tolist())

    def _ends(self, t0: float, t1: float) -> tuple[int, int, int] | None:
        """The rows of the first and the last port sample in [t0, t1] and how many there
        are, read from the newest back (see :meth:`_ports_in`; of samples of equal time,
        the newest to arrive)."""
        newest_first = self.port.order()[::-1]
        t = self.port.ts[newest_first]
        old = np.flatnonzero(t < t0 - ORDER_SLACK_S)
        if len(old):
            newest_first, t = newest_first[: old[0]], t[: old[0]]
        inside = (t0 <= t) & (t <= t1)
        rows, t = newest_first[inside], t[inside]
        if not len(rows):
            return None
        return int(rows[np.argmin(t)]), int(rows[np.argmax(t)]), len(rows)

    def _ends_signals(self, t0: float, t1: float) -> list[PortSignals]:
        """:meth:`port_signals` from the window's first and last samples alone."""
        ends = self._ends(t0, t1)
        if ends is None:
            return []
        first, last, n = ends
        ts, ints = self.port.ts, self.port.ints
        span = float(ts[last] - ts[first])
        downs = self.link_downs(t0, t1)
        a, b = ints[first], ints[last]
        if np.array_equal(a[:, 0], b[:, 0]):  # the same ports in the same order (the rule)
            return self._pairs_signals(a, b, n, span, downs)
        before = {i[0]: i for i in a.tolist() if i[0] != ABSENT}
        after = {i[0]: i for i in b.tolist() if i[0] != ABSENT}
        out = []
        for (device, port), kid in sorted(
            (self._key_names_of(k), k) for k in before.keys() | after.keys()
        ):
            p = after.get(kid) or before[kid]
            q = before.get(kid, p)
            rise = _rises(_counters(q), _counters(p))
            cnp = rise[0] + rise[1] + rise[2]
            errors = {ERROR_NAMES[i]: v for i, v in enumerate(rise[4:]) if v}
            out.append(
                PortSignals(
                    device=device,
                    port=port,
                    samples=n,
                    cnp_per_s=cnp / span if span > 0 else 0.0,
                    xmit_wait_per_s=rise[3] / span if span > 0 else 0.0,
                    errors=errors,
                    down=bool(q[1] or p[1]) or (device, port) in downs or (device, None) in downs,
                )
            )
        return out

    def _pairs_signals(
        self,
        a: np.ndarray,
        b: np.ndarray,
        n: int,
        span: float,
        downs: set[tuple[str | None, int | None]],
    ) -> list[PortSignals]:
        """:meth:`_ends_signals` when both ends hold the same ports in the same order: every
        counter's rise at once (:func:`_rises`, vectorised)."""
        keep = a[:, 0] != ABSENT
        a, b = a[keep], b[keep]
        rise = rises_of(a[:, COUNTER_COLS], b[:, COUNTER_COLS])
        cnp = rise[:, :3].sum(axis=1).tolist()
        wait = rise[:, 3].tolist()
        errs = rise[:, 4:]
        has_err: list[bool] = np.asarray(errs.any(axis=1)).tolist()
        down: list[bool] = ((a[:, 1] != 0) | (b[:, 1] != 0)).tolist()  # bool(q[1] or p[1])
        out = []
        for (device, port), i in sorted(
            (self._key_names_of(k), i) for i, k in enumerate(a[:, 0].tolist())
        ):
            errors = (
                {ERROR_NAMES[j]: v for j, v in enumerate(errs[i].tolist()) if v}
                if has_err[i]
                else {}
            )
            out.append(
                PortSignals(
                    device=device,
                    port=port,
                    samples=n,
                    cnp_per_s=cnp[i] / span if span > 0 else 0.0,
                    xmit_wait_per_s=wait[i] / span if span > 0 else 0.0,
                    errors=errors,
                    down=down[i] or (device, port) in downs or (device, None) in downs,
                )
            )
        return out

    def rise_start(self, device: str, port: int, t0: float, t1: float, level: float) -> float:
        """Start of the trailing run of sample intervals in [t0, t1] in which the port's
        congestion rate (ECN/CNP + xmit_wait, whichever ``level`` is in) stayed at or above
        ``level`` per second: when its rise began (``t1`` when the last one is below)."""
        kid = self._port_keys.get((device, port))
        ring = self.port
        rows = _in_range(ring, t0, t1)
        pts: list[tuple[float, int]] = []
        if kid is not None and rows:
            for r, irow in zip(rows, ring.ints[rows].tolist(), strict=True):
                for i in irow:
                    if i[0] == kid:
                        pts.append((float(ring.ts[r]), sum(max(i[j], 0) for j in _RISE)))
        start = t1
        for (ta, a), (tb, b) in reversed(list(pairwise(pts))):
            if tb <= ta or (b - a) / (tb - ta) < level:
                break
            start = ta
        return start

    def host_view(self, t0: float, t1: float) -> View:
        """This window and the range [t0, t1] on its clock (a shifted view shifts it)."""
        return self, t0, t1

    def link_downs(self, t0: float, t1: float) -> set[tuple[str | None, int | None]]:
        """(device, port) of the link-down events in [t0, t1] (port None: the device's)."""
        return {
            (e.device, e.port)
            for e in self.events_in(t0, t1, EventType.LINK_STATE)
            if "down" in (e.detail or "").lower()
        }

    def port_signals(self, t0: float, t1: float, ends_only: bool = False) -> list[PortSignals]:
        """Rates and error increases of every port of the host over [t0, t1].

        ``ends_only`` (the periodic network checks): from the window's first and last
        samples alone, a link counted down from their states, link-down events and
        ``link_downed``; a counter reset inside the window then costs the window.
        """
        if ends_only:
            return self._ends_signals(t0, t1)
        rows = self._ports_in(t0, t1)
        if not rows:
            return []
        n = len(rows)
        series: dict[int, list[list[int]]] = {}
        for irow in self.port.ints[rows].tolist():
            for i in irow:
                if i[0] != ABSENT:
                    got = series.get(i[0])
                    if got is None:
                        series[i[0]] = [i]
                    else:
                        got.append(i)
        span = float(self.port.ts[rows[-1]] - self.port.ts[rows[0]])
        downs = self.link_downs(t0, t1)
        out = []
        for (device, port), readings in sorted(
            (self._key_names_of(k), v) for k, v in series.items()
        ):
            cnp = sum(_rise(readings, c) for c in _CONG)
            errors = {c.removesuffix("_total"): v for c, j in _ERRORS if (v := _rise(readings, j))}
            down = any(i[1] for i in readings)
            out.append(
                PortSignals(
                    device=device,
                    port=port,
                    samples=len(readings) if not ends_only else n,
                    cnp_per_s=cnp / span if span > 0 else 0.0,
                    xmit_wait_per_s=_rise(readings, _WAIT) / span if span > 0 else 0.0,
                    errors=errors,
                    down=down or (device, port) in downs or (device, None) in downs,
                )
            )
        return out

    def _key_names_of(self, kid: int) -> tuple[str, int]:
        if len(self._key_names) < len(self._port_keys):
            self._key_names = sorted(self._port_keys, key=self._port_keys.__getitem__)
        return self._key_names[kid]


def _in_range(ring: SampleView, t0: float, t1: float) -> list[int]:
    """The rows of the samples in [t0, t1], in arrival order."""
    order = ring.order()
    t = ring.ts[order]
    return cast("list[int]", order[(t0 <= t) & (t <= t1)].tolist())


_COL = {name: j for j, name in enumerate(PORT_INTS)}
_CONG = [_COL[c] for c in CONGESTION_COUNTERS]
_WAIT = _COL["xmit_wait_total"]
_RISE = [_WAIT, *_CONG]  # xmit_wait + ECN/CNP: the congestion level of rise_start
_ERRORS = [(c, _COL[c]) for c in ERROR_COUNTERS]
COUNTER_COLS = slice(_COL[CONGESTION_COUNTERS[0]], None)  # congestion, xmit_wait, errors
# which of COUNTER_COLS may wrap at 32 bits (the contract's WRAPPING: the congestion
# hw_counters); the IB PMA's counters/ (xmit_wait, the errors) saturate, and a decrease
# there is a reset (``perfquery -R``): read as a wrap, one from 3.5e9 was ~8e8 ticks
WRAPS = np.array([c in WRAPPING for c in PORT_INTS[COUNTER_COLS]])
_WRAPPING_COLS = frozenset(_COL[c] for c in PORT_INTS if c in WRAPPING)


def _counters(row: list[int]) -> tuple[int | None, ...]:
    """A port row's counters in PORT_COUNTERS order (congestion, xmit_wait, errors)."""
    return tuple(None if v == ABSENT else v for v in row[COUNTER_COLS])


_CLOCK, _POWER, _TEMP, _UTIL = range(len(GPU_FLOATS))
_THROTTLE, _DBE, _REMAP = 1, 2, 3  # GPU_INTS after the index


def _series_by_gpu(floats: np.ndarray, ints: np.ndarray) -> dict[int, _GpuSeries]:
    """Each GPU's readings (rows, column slots, fields) as a :class:`_GpuSeries`, in
    arrival order: grouped by GPU index with one stable sort, each field read as a list
    once (the same series as :meth:`_GpuSeries.add` reading by reading)."""
    f = floats.reshape(-1, floats.shape[-1])
    i = ints.reshape(-1, ints.shape[-1])
    kept = i[:, 0] != ABSENT
    order = np.flatnonzero(kept)[np.argsort(i[kept, 0], kind="stable")]
    f, i = f[order], i[order]
    index = i[:, 0]
    if not len(index):
        return {}  # samples without a GPU reading (no device seen: the contract allows it)
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]]).tolist()
    ends = [*starts[1:], len(index)]
    fcols, icols = f.T.tolist(), i.T.tolist()
    out: dict[int, _GpuSeries] = {}
    for a, b in zip(starts, ends, strict=True):
        s = out[icols[0][a]] = _GpuSeries()
        s.reasons = icols[_THROTTLE][a:b]
        s.clocks, s.power, s.temps, s.utils = (
            [v for v in fcols[k][a:b] if v == v] for k in (_CLOCK, _POWER, _TEMP, _UTIL)
        )
        s.dbe = [None if v == ABSENT else v for v in icols[_DBE][a:b]]
        s.remap = [None if v == ABSENT else v for v in icols[_REMAP][a:b]]
    return out


class _GpuSeries:
    """One GPU's readings in a range, field by field, in arrival order (None: absent)."""

    __slots__ = ("clocks", "dbe", "power", "reasons", "remap", "temps", "utils")

    def __init__(self) -> None:
        self.reasons: list[int] = []
        self.clocks: list[float] = []
        self.power: list[float] = []
        self.temps: list[float] = []
        self.utils: list[float] = []
        self.dbe: list[int | None] = []
        self.remap: list[int | None] = []

    def add(self, f: list[float], i: list[int]) -> None:
        self.reasons.append(i[_THROTTLE])
        for value, out in (
            (f[_CLOCK], self.clocks),
            (f[_POWER], self.power),
            (f[_TEMP], self.temps),
            (f[_UTIL], self.utils),
        ):
            if value == value:  # not NaN: the reading had it
                out.append(value)
        self.dbe.append(None if i[_DBE] == ABSENT else i[_DBE])
        self.remap.append(None if i[_REMAP] == ABSENT else i[_REMAP])


def rises_of(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`_rises` of many counters at once (int64 arrays, ABSENT where unknown)."""
    absent = (x == ABSENT) | (y == ABSENT)
    wrapped = WRAPS & (y < x) & (x < WRAP_32) & (x >= WRAP_32 * 3 // 4)  # a 32-bit wrap
    rise = np.where(y >= x, y - x, np.where(wrapped, y + WRAP_32 - x, y))  # else: a reset
    return np.where(absent, 0, rise)


def _rises(a: tuple[int | None, ...], b: tuple[int | None, ...]) -> list[int]:
    """Increase of each counter from reading ``a`` to reading ``b`` (as :func:`_rise` for
    two readings: a reset or a 32-bit wrap is read as such, never as a negative)."""
    out = []
    for x, y, wraps in zip(a, b, WRAPS.tolist(), strict=True):
        if x is None or y is None:
            out.append(0)
        elif y >= x:
            out.append(y - x)
        else:
            out.append(delta(x, y, WRAP_32 if wraps and x < WRAP_32 else None) or 0)
    return out


def _gpu_signals(s: _GpuSeries, events: list[EventMessage]) -> GpuSignals:
    xids = tuple(int(e.code) for e in events if e.type == EventType.XID and e.code is not None)
    dbe_events = sum(1 for e in events if e.type == EventType.ECC and is_dbe(e))
    n = len(s.reasons)
    if not n:
        return GpuSignals(0, {}, None, None, None, None, None, dbe_events, 0, xids)
    reasons = s.reasons
    seen = 0
    for x in reasons:
        seen |= x
    share = {
        bit: (sum(1 for x in reasons if x & bit) / n if seen & bit else 0.0)
        for bit in THROTTLE_NAMES
    }  # a bit no sample has: 0 without a pass
    clocks = s.clocks
    return GpuSignals(
        samples=n,
        throttle_share=share,
        sm_clock_ratio=median_of(clocks),
        sm_clock_ratio_low=sorted(clocks)[len(clocks) // 4] if clocks else None,
        temp_c=median_of(s.temps),
        power_ratio=median_of(s.power),
        util_pct=median_of(s.utils),
        ecc_dbe=_increase(s.dbe) + dbe_events,
        remapped_uncorrectable=_increase(s.remap),
        xids=xids,
    )


# The events a host window keeps, apart: the host's own hardware facts (from its agent's
# collectors) and ranks' exceptions. Before, one list of every event of every job on the
# host: 130 checkpoint events of one job pushed the XID of another job's failed GPU out,
# and its stopped rank read as cause unknown.
HOST_EVENTS = frozenset({EventType.XID, EventType.ECC, EventType.LINK_STATE})
MAX_EXCEPTION_JOBS = 16  # jobs whose exceptions a host keeps (a host runs a few jobs)
# what the window's readers take from an event's attrs (is_peer_failure, the link state);
# the rest is not kept: one event of 65,000 attrs (a 1 MiB message) held ~8 MB here
_KEPT_ATTRS = ("exception", "message", "state")
_MAX_KEPT_TEXT = 1024


def _slim(e: EventMessage) -> EventMessage:
    """The event with only the attrs the window's readers read, texts clipped."""
    kept = {k: _clip(v) for k, v in e.attrs.items() if k in _KEPT_ATTRS}
    detail = e.detail[:_MAX_KEPT_TEXT]
    if kept == e.attrs and detail == e.detail:
        return e
    return msgspec.structs.replace(e, attrs=kept, detail=detail)


def _clip(value: object) -> object:
    return value[:_MAX_KEPT_TEXT] if isinstance(value, str) else value


def is_dbe(e: EventMessage) -> bool:
    text = (e.detail or "").lower()
    return "dbe" in text or "double" in text


def _rise(readings: list[list[int]], j: int) -> int:
    """The increase of one cumulative counter (column ``j``) over a port's readings: last -
    first when that is not negative (no reset or wrap between the ends; a reset followed
    by growth past the first value within one window would be undercounted, never
    negative), the sample-to-sample sum otherwise."""
    first, last = readings[0][j], readings[-1][j]
    if first != ABSENT and last != ABSENT and last >= first:
        return int(last - first)
    return _increase(
        [None if p[j] == ABSENT else p[j] for p in readings], wraps=j in _WRAPPING_COLS
    )


def _increase(values: list[int | None], wraps: bool = False) -> int:
    """Sum of sample-to-sample increases of a cumulative counter (resets handled; a
    decrease from the top quarter of 32 bits is a wrap when the counter ``wraps``)."""
    total = 0
    prev: int | None = None
    for v in values:
        if v is None:
            continue
        if prev is not None:
            wrap = WRAP_32 if wraps and v < prev < WRAP_32 else None
            total += delta(prev, v, wrap) or 0
        prev = v
    return total


def median_of(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2
