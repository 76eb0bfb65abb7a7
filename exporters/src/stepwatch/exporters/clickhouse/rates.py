"""Rates and deltas from cumulative counters, per (host, inst, device, port) or (host, inst, gpu).

Samples carry raw cumulative counters; the sink remembers the last reading of
each key and stores the increase since it next to the raw values, using the
shared reset/wrap rules of :mod:`stepwatch.contract.counters`. A key the
tracker has not seen (sink restart, a new sink instance after a rebalance) is
seeded from the last stored sample, so rates are continuous across restarts.

Wrap rule: a counter whose previous value fits in 32 bits is treated as
possibly 32-bit (legacy sysfs counters), so a decrease from the top quarter of
that range is a wrap; any other decrease is a reset and the increase is the
new value. Readings more than ``max_gap`` seconds apart (default 300) give no
rate: across a long silence a counter may have been reset and grown again, and
an average over that long says nothing about when errors happened.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from stepwatch.contract import GpuReading, PortReading
from stepwatch.contract.counters import WRAP_32, WRAP_64, delta

PORT_COUNTERS: tuple[str, ...] = tuple(
    name for name in PortReading.__struct_fields__ if name.endswith("_total")
)
PORT_RATES: tuple[str, ...] = tuple(name[: -len("_total")] + "_per_s" for name in PORT_COUNTERS)

# (counter in the reading, column with its increase since the previous sample)
GPU_DELTAS: tuple[tuple[str, str], ...] = (
    ("ecc_sbe_total", "ecc_sbe_new"),
    ("ecc_dbe_total", "ecc_dbe_new"),
    ("remapped_rows_uncorrectable", "remapped_rows_uncorrectable_new"),
    ("pcie_replay_total", "pcie_replay_new"),
)
GPU_RATES: tuple[tuple[str, str], ...] = (
    ("nvlink_tx_bytes_total", "nvlink_tx_bytes_per_s"),
    ("nvlink_rx_bytes_total", "nvlink_rx_bytes_per_s"),
)
GPU_COUNTERS: tuple[str, ...] = tuple(c for c, _ in GPU_DELTAS + GPU_RATES)

MAX_GAP_SECONDS = 300.0

Key = tuple[str, ...] | tuple[str, str, str, int] | tuple[str, str, int]
Values = Sequence[int | None]


def wrap_for(prev: int) -> int:
    return WRAP_32 if prev < WRAP_32 else WRAP_64


@dataclass(frozen=True)
class Reading:
    """A key's last known counters; ``since``: when each was read, where not all at ``ts``
    (a counter a sample lacked keeps its earlier value and time)."""

    ts: float
    values: tuple[int | None, ...]
    since: tuple[float, ...] | None = None

    def read_at(self, i: int) -> float:
        return self.ts if self.since is None else self.since[i]


@dataclass(frozen=True)
class Change:
    """Increase of each counter since the previous reading, and the time between."""

    dt: float | None
    deltas: tuple[int | None, ...]

    @property
    def known(self) -> bool:
        return self.dt is not None

    def rates(self) -> tuple[float | None, ...]:
        if not self.dt:
            return tuple(None for _ in self.deltas)
        return tuple(None if d is None else d / self.dt for d in self.deltas)


class CounterTracker:
    """The last reading per key (bounded, least recently used dropped first)."""

    def __init__(
        self, width: int, max_keys: int = 500_000, max_gap: float = MAX_GAP_SECONDS
    ) -> None:
        self.width = width
        self.max_keys = max_keys
        self.max_gap = max_gap
        self._last: OrderedDict[Key, Reading] = OrderedDict()
        self._looked_up: set[Key] = set()

    def __contains__(self, key: Key) -> bool:
        return key in self._last

    def needs_seed(self, key: Key) -> bool:
        return key not in self._last and key not in self._looked_up

    def seed(self, key: Key, reading: Reading | None) -> None:
        """Record a stored reading (None: the store has none) for a key not yet seen."""
        self._looked_up.add(key)
        if reading is not None and key not in self._last:
            self._remember(key, reading)

    def update(self, key: Key, ts: float, values: Values) -> Change:
        """Account a new reading; unknown change when there is no earlier reading."""
        prev = self._last.get(key)
        current = Reading(ts, tuple(values))
        if prev is None or ts - prev.ts > self.max_gap:
            self._remember(key, current)
            return Change(None, tuple(None for _ in values))
        if ts <= prev.ts:  # duplicate or out of order: no change, keep the newer state
            return Change(None, tuple(None for _ in values))
        pairs = tuple(zip(prev.values, current.values, strict=True))
        if prev.since is None and all((p is None) is (c is None) for p, c in pairs):
            # the same counters in both (a device that never has some: NVLink on many)
            deltas = tuple(
                None if p is None or c is None else delta(p, c, wrap_for(p)) for p, c in pairs
            )
            self._remember(key, current)
            return Change(ts - prev.ts, deltas)
        return self._partial(key, prev, current)

    def _partial(self, key: Key, prev: Reading, current: Reading) -> Change:
        """A change where one reading lacks a counter the other has (NVML answers a failed
        call with no value). A counter a sample lacks keeps its earlier value and time,
        and the next sample's increase counts from it: dropping the value made the next
        increase unknown, and a new ECC error in it went uncounted. The increase is
        the next interval's (its rate over that interval): the store's rollups total a
        counter as rate x interval, which then counts it whole."""
        ts = current.ts
        deltas: list[int | None] = []
        kept: list[int | None] = []
        since: list[float] = []
        for i, (p, c) in enumerate(zip(prev.values, current.values, strict=True)):
            at = prev.read_at(i)
            if p is not None and ts - at > self.max_gap:
                p = None  # carried across too long a silence: no baseline
            if c is None:
                deltas.append(None)
                kept.append(p)
                since.append(at if p is not None else ts)
                continue
            deltas.append(None if p is None else delta(p, c, wrap_for(p)))
            kept.append(c)
            since.append(ts)
        carried = any(t != ts for t in since)
        self._remember(key, Reading(ts, tuple(kept), tuple(since) if carried else None))
        return Change(ts - prev.ts, tuple(deltas))

    def _remember(self, key: Key, reading: Reading) -> None:
        self._last[key] = reading
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        if len(self._looked_up) > self.max_keys:
            self._looked_up.clear()


def port_values(reading: PortReading) -> tuple[int | None, ...]:
    return tuple(getattr(reading, name) for name in PORT_COUNTERS)


def gpu_values(reading: GpuReading) -> tuple[int | None, ...]:
    return tuple(getattr(reading, name) for name in GPU_COUNTERS)


def gpu_derived(change: Change) -> tuple[object, ...]:
    """Computed GPU columns in table order: dt_s, the deltas, the rates."""
    n = len(GPU_DELTAS)
    rates = change.rates()[n:]
    return (change.dt, *change.deltas[:n], *rates)
