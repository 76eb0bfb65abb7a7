"""Rates and deltas from cumulative counters, per (host, inst, device, port) or (host, inst, gpu).

Samples carry raw cumulative counters; the sink remembers the last reading of
each key and stores the increase since it next to the raw values, using the
shared reset/wrap rules of :mod:`stepwatch.contract.counters`. A key the
tracker has not seen (sink restart, a new sink instance after a rebalance) is
seeded from the last stored sample, so rates are continuous across restarts.

Wrap rule: only a counter that can wrap at 32 bits (:data:`PORT_WRAPS`,
:data:`GPU_WRAPS`: mlx5 ``hw_counters``, NVML's PCIe replay count) has a
decrease from the top quarter of that range read as a wrap. The InfiniBand
``counters/`` (the PMA's PortCounters) saturate at their width instead, and
their extended forms are 64-bit; ECC, row-remap and NVLink counters are 64-bit:
for those, as for any other decrease, it is a reset and the increase is the new
value (read as a wrap, ``perfquery -R`` on a port whose ``port_xmit_wait`` was at
3.5e9 stored 7.9e8 ticks of congestion that never happened). An increase faster
than the counter can grow (bytes beyond the link's rate: a counter that went back
a little, a device renamed under the agent) is no increase: the reading's rates
are unknown and it is the next one's baseline. Readings more than ``max_gap``
seconds apart (default 300) give no rate: across a long silence a counter may
have been reset and grown again, and an average over that long says nothing
about when errors happened.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from stepwatch.contract import GpuReading, PortReading
from stepwatch.contract.counters import WRAP_32, WRAP_64, WRAPPING, delta

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

# per counter: may it wrap at 32 bits (the contract's WRAPPING; the rest saturate or
# are 64-bit, and a decrease is a reset)
PORT_WRAPS: tuple[bool, ...] = tuple(name in WRAPPING for name in PORT_COUNTERS)
GPU_WRAPS: tuple[bool, ...] = tuple(name in WRAPPING for name in GPU_COUNTERS)
BYTE_COUNTERS = ("xmit_bytes_total", "rcv_bytes_total")  # 4 x the PMA's data words
PORT_BYTES: tuple[int, ...] = tuple(PORT_COUNTERS.index(name) for name in BYTE_COUNTERS)
# the IB PMA's legacy counters/ stop at 2^32-1 (the data counters count 4-byte words: the
# agent's bytes stop at 4 x that): a reading there says nothing of the increase since
PORT_SATURATION: tuple[int | None, ...] = tuple(
    None if wraps else 4 * (WRAP_32 - 1) if name in BYTE_COUNTERS else WRAP_32 - 1
    for name, wraps in zip(PORT_COUNTERS, PORT_WRAPS, strict=True)
)
LINK_RATE_MARGIN = 4.0  # tick jitter: readings are stamped at the tick, read a little later

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
    spans: tuple[float, ...] | None = None  # seconds each increase spans (None: all dt)
    impossible: bool = False  # an increase faster than its counter can grow: all unknown

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
        self,
        width: int,
        max_keys: int = 500_000,
        max_gap: float = MAX_GAP_SECONDS,
        wraps: Sequence[bool] | None = None,
        saturation: Sequence[int | None] | None = None,
    ) -> None:
        self.width = width
        # per counter: may it be 32-bit and wrap (None: every counter may)
        self.wraps = tuple(wraps) if wraps is not None else (True,) * width
        # per counter: the value it stops at, if it saturates (None: it does not)
        self.saturation = tuple(saturation) if saturation is not None else (None,) * width
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

    def update(
        self, key: Key, ts: float, values: Values, ceilings: Sequence[float | None] = ()
    ) -> Change:
        """Account a new reading; unknown change when there is no earlier reading.

        ``ceilings``: per counter, the most it can grow in a second (None: no bound);
        an increase beyond it makes every increase of the reading unknown.
        """
        change = self._update(key, ts, values)
        if ceilings and change.dt is not None and self._impossible(change, ceilings):
            return Change(change.dt, tuple(None for _ in values), impossible=True)
        return change

    @staticmethod
    def _impossible(change: Change, ceilings: Sequence[float | None]) -> bool:
        """An increase faster than its counter can grow over the time it spans."""
        assert change.dt is not None
        spans = change.spans or (change.dt,) * len(change.deltas)
        for d, ceiling, span in zip(change.deltas, ceilings, spans, strict=False):
            if d is not None and ceiling is not None and d > ceiling * span:
                return True
        return False

    def _update(self, key: Key, ts: float, values: Values) -> Change:
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
                None if p is None or c is None else self._delta(i, p, c)
                for i, (p, c) in enumerate(pairs)
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
        spans: list[float] = []
        for i, (p, c) in enumerate(zip(prev.values, current.values, strict=True)):
            at = prev.read_at(i)
            spans.append(ts - at)
            if p is not None and ts - at > self.max_gap:
                p = None  # carried across too long a silence: no baseline
            if c is None:
                deltas.append(None)
                kept.append(p)
                since.append(at if p is not None else ts)
                continue
            deltas.append(None if p is None else self._delta(i, p, c))
            kept.append(c)
            since.append(ts)
        carried = any(t != ts for t in since)
        self._remember(key, Reading(ts, tuple(kept), tuple(since) if carried else None))
        return Change(ts - prev.ts, tuple(deltas), tuple(spans))

    def _delta(self, i: int, prev: int, cur: int) -> int | None:
        """Counter ``i``'s increase: unknown when it reads its saturation value (stuck
        there, it grew by an unknown amount; before, a congested port's saturated
        port_xmit_wait read as a rate of 0, an idle port)."""
        if cur == self.saturation[i]:
            return None
        return delta(prev, cur, wrap_for(prev) if self.wraps[i] else None)

    def _remember(self, key: Key, reading: Reading) -> None:
        self._last[key] = reading
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        if len(self._looked_up) > self.max_keys:
            self._looked_up.clear()


def port_values(reading: PortReading) -> tuple[int | None, ...]:
    return tuple(getattr(reading, name) for name in PORT_COUNTERS)


def port_ceilings(reading: PortReading) -> tuple[float | None, ...]:
    """Per port counter, the most it can grow in a second: the byte counters at the
    link's rate (with a margin for tick jitter); () when the rate is unknown."""
    if not reading.rate_gbps:
        return ()
    most = reading.rate_gbps * 1e9 / 8 * LINK_RATE_MARGIN
    return tuple(most if i in PORT_BYTES else None for i in range(len(PORT_COUNTERS)))


def gpu_values(reading: GpuReading) -> tuple[int | None, ...]:
    return tuple(getattr(reading, name) for name in GPU_COUNTERS)


def gpu_derived(change: Change) -> tuple[object, ...]:
    """Computed GPU columns in table order: dt_s, the deltas, the rates."""
    n = len(GPU_DELTAS)
    rates = change.rates()[n:]
    return (change.dt, *change.deltas[:n], *rates)
