"""Compact rings of every host's GPU and port samples: only the fields the causes read.

A decoded :class:`~stepwatch.contract.GpuMessage` of 8 readings takes about
7.6 KB of Python objects and a :class:`~stepwatch.contract.PortMessage` of 8
ports about 6.2 KB; kept for ``host_samples`` (128) samples per host they were
~220 KB per rank of a large job. Here each sample is one row of fixed-size
NumPy arrays shared by the engine's hosts (a slot per host, ~19 KB per rank):
one column slot per reading of the message (in message order),
float64 for gauges (NaN: absent) and int64 for counters and indices (-1:
absent; contract counters are at most 2**63 - 1, so int64 holds them exactly). The
readers get back plain Python values, identical to the message's, in arrival
order: :mod:`stepwatch.streams.core.hostwindow` computes the signals from them
exactly as it did from the messages.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, cast

import numpy as np

from stepwatch.contract import GpuReading, PortReading
from stepwatch.streams.core.packing import layout, pack_absent

ABSENT = -1  # an int column's "no value" (None, or no reading in this slot)

# GPU: gauges as floats, then index and counters as ints
GPU_FLOATS = ("sm_clock_ratio", "power_ratio", "temp_gpu_c", "util_gpu_pct")
GPU_INTS = ("index", "throttle_reasons", "ecc_dbe_total", "remapped_rows_uncorrectable")

# ports: the port's key id, a state other than ACTIVE, then the counters the signals read
PORT_COUNTERS = (
    "np_cnp_sent_total",
    "rp_cnp_handled_total",
    "np_ecn_marked_roce_packets_total",
    "xmit_wait_total",
    "symbol_error_total",
    "link_downed_total",
    "link_error_recovery_total",
    "rcv_errors_total",
    "local_link_integrity_errors_total",
)
PORT_INTS = ("key", "bad_state", *PORT_COUNTERS)


Raw = list[bytes]  # readings' packed records, one each (gpu_rows, port_rows)
Convert = Callable[[Raw], tuple[np.ndarray, np.ndarray]]


class SampleStore:
    """The last ``size`` samples of every host of an engine, one slot per host.

    ``ts`` is (slots, size); ``floats`` (slots, size, width, n_floats) and ``ints``
    (slots, size, width, n_ints) hold one reading per column slot (``ints[..., 0] ==
    ABSENT``: none). ``width`` grows to the widest message. Samples are staged as their
    readings' packed records (``gpu_rows``, ``port_rows``), every host's together, and
    written ``STAGE_READINGS`` at a time: one NumPy conversion and one scatter for
    hundreds of messages. A reader goes through :meth:`view`, whose
    :meth:`SampleView.order` flushes first.
    """

    STAGE_READINGS = 4096

    def __init__(self, size: int, n_floats: int, n_ints: int, convert: Convert) -> None:
        self.size = size
        self.convert = convert
        self.ts = np.full((0, size), np.nan)
        self.floats = np.full((0, size, 0, n_floats), np.nan)
        self.ints = np.full((0, size, 0, n_ints), ABSENT, dtype=np.int64)
        self.pos = np.zeros(0, np.int64)  # each slot's next row to write
        self.count = np.zeros(0, np.int64)  # rows written, capped at size
        self._free: list[int] = []
        self._used = 0
        self._slot: list[int] = []  # the staged samples: slot, time, readings ...
        self._ts: list[float] = []
        self._n: list[int] = []
        self._raw: Raw = []

    def open(self) -> int:
        """A slot for a new host."""
        if self._free:
            return self._free.pop()
        if self._used == len(self.ts):
            self._grow(max(8, 2 * len(self.ts)))
        self._used += 1
        return self._used - 1

    def close(self, slot: int) -> None:
        """Forget a host's samples; its slot is reused."""
        self.flush()
        self.pos[slot] = self.count[slot] = 0
        self._free.append(slot)

    def add(self, slot: int, ts: float, raw: Raw) -> None:
        """Stage one sample: its readings' packed records (``convert`` reads them)."""
        self._slot.append(slot)
        self._ts.append(ts)
        self._n.append(len(raw))
        self._raw.extend(raw)
        if len(self._raw) >= self.STAGE_READINGS:
            self.flush()

    def view(self, slot: int) -> SampleView:
        return SampleView(self, slot)

    def flush(self) -> None:
        """Write the staged samples into the arrays."""
        if not self._slot:
            return
        staged = self._slot
        slots, ts, counts = (
            np.array(staged),
            np.array(self._ts, dtype=float),
            np.array(self._n, dtype=np.int64),
        )
        raw = self._raw
        self._slot, self._ts, self._n, self._raw = [], [], [], []
        floats, ints = self.convert(raw)
        if counts.max() > self.ints.shape[2]:
            self._widen(int(counts.max()))
        block_f, block_i = self._blocks(counts, floats, ints)
        if len(set(staged)) == len(staged):  # one sample per host (a reader flushed soon)
            rows = self.pos[slots]
            self._write(slots, rows, ts, block_f, block_i)
            self.pos[slots] = (rows + 1) % self.size
            self.count[slots] = np.minimum(self.count[slots] + 1, self.size)
            return
        occ, total = _occurrences(slots)
        keep = occ >= total - self.size  # a host's last `size` samples of this batch
        rows = (self.pos[slots] + occ) % self.size
        self._write(slots[keep], rows[keep], ts[keep], block_f[keep], block_i[keep])
        seen, n = np.unique(slots, return_counts=True)
        self.pos[seen] = (self.pos[seen] + n) % self.size
        self.count[seen] = np.minimum(self.count[seen] + n, self.size)

    def at(self, slots: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (floats, ints) of the samples at (``slots[k]``, ``rows[k]``), each
        (samples, width, n), gathered as :meth:`_write` scatters. The caller flushed
        (its rows came from ``pos``, ``count`` and ``ts``)."""
        flat = slots * self.size + rows
        _, _, width, nf = self.floats.shape
        f = _rows(self.floats)[flat].reshape(len(flat), width, nf)
        return f, _rows(self.ints)[flat].reshape(len(flat), width, self.ints.shape[3])

    def _write(
        self, slots: np.ndarray, rows: np.ndarray, ts: np.ndarray, f: np.ndarray, i: np.ndarray
    ) -> None:
        """Write whole sample rows at (slot, row): through 2-D views of the arrays, one
        flat row index each (NumPy's fast path: ~8x cheaper than indexing the 4-D
        arrays with two index arrays, which copies reading by reading)."""
        flat = slots * self.size + rows
        self.ts[slots, rows] = ts
        _rows(self.floats)[flat] = f.reshape(len(flat), -1)
        _rows(self.ints)[flat] = i.reshape(len(flat), -1)

    def _blocks(
        self, counts: np.ndarray, floats: np.ndarray, ints: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The readings as whole rows (messages, width, ...), empty slots padded."""
        m, width = len(counts), self.ints.shape[2]
        block_i = np.full((m, width, self.ints.shape[3]), ABSENT, dtype=np.int64)
        block_f = np.full((m, width, self.floats.shape[3]), np.nan)
        if (counts == width).all():
            block_i[:] = ints.reshape(block_i.shape)
            block_f[:] = floats.reshape(block_f.shape)
            return block_f, block_i
        msg = np.repeat(np.arange(m), counts)
        col = np.arange(len(msg)) - np.repeat(np.cumsum(counts) - counts, counts)
        block_i[msg, col] = ints
        block_f[msg, col] = floats
        return block_f, block_i

    def _grow(self, slots: int) -> None:
        """Room for ``slots`` hosts. The new slots' rows are left unwritten (``np.empty``:
        their memory is not touched until samples land there; a row is read only once
        written, see :meth:`SampleView.order`)."""
        self.ts = _extended(self.ts, 0, slots)
        self.floats = _extended(self.floats, 0, slots)
        self.ints = _extended(self.ints, 0, slots)
        self.pos = np.concatenate([self.pos, np.zeros(slots - len(self.pos), np.int64)])
        self.count = np.concatenate([self.count, np.zeros(slots - len(self.count), np.int64)])

    def _widen(self, width: int) -> None:
        """Room for ``width`` readings a sample. The rows written so far read the new
        column slots as empty (NaN, ABSENT); the others are left unwritten, as in
        :meth:`_grow` (at 2,048 hosts, filling them all cost ~1 s of CPU and ~250 MB of
        memory before the first sample landed)."""
        w = self.ints.shape[2]
        self.ints = _extended(self.ints, 2, width)
        self.floats = _extended(self.floats, 2, width)
        written = np.arange(self.size) < self.count[:, None]  # rows [0, count) of each slot
        self.ints[written, w:] = ABSENT
        self.floats[written, w:] = np.nan


def _rows(a: np.ndarray) -> np.ndarray:
    """A (slots, size, width, n) array as a (slots * size, width * n) view of it."""
    s = a.shape
    return a.reshape(s[0] * s[1], s[2] * s[3], copy=False)  # a view or an error, never a copy


def _extended(a: np.ndarray, axis: int, n: int) -> np.ndarray:
    """``a`` with ``axis`` extended to ``n``, the new part not written (``np.empty``)."""
    shape = list(a.shape)
    shape[axis] = n
    out = np.empty(shape, a.dtype)
    out[(slice(None),) * axis + (slice(0, a.shape[axis]),)] = a
    return out


def _occurrences(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each staged sample: how many of its slot's samples came before it in the batch,
    and how many its slot has in the batch."""
    order = np.argsort(slots, kind="stable")
    s = slots[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    length = np.diff(np.r_[starts, len(s)])
    occ, total = np.empty(len(s), np.int64), np.empty(len(s), np.int64)
    occ[order] = np.arange(len(s)) - np.repeat(starts, length)
    total[order] = np.repeat(length, length)
    return occ, total


class SampleView:
    """One host's samples in a :class:`SampleStore` (arrays read after :meth:`order`)."""

    __slots__ = ("slot", "store")

    def __init__(self, store: SampleStore, slot: int) -> None:
        self.store = store
        self.slot = slot

    def __len__(self) -> int:
        self.store.flush()
        return int(self.store.count[self.slot])

    def order(self) -> np.ndarray:
        """Row numbers in arrival order, oldest first (staged samples written first)."""
        store = self.store
        store.flush()
        count = int(store.count[self.slot])
        start = (int(store.pos[self.slot]) - count) % store.size
        return (start + np.arange(count)) % store.size

    @property
    def ts(self) -> np.ndarray:
        return cast("np.ndarray", self.store.ts[self.slot])

    @property
    def floats(self) -> np.ndarray:
        return cast("np.ndarray", self.store.floats[self.slot])

    @property
    def ints(self) -> np.ndarray:
        return cast("np.ndarray", self.store.ints[self.slot])


class HostStores:
    """The GPU and port sample stores of one engine (shared by its host windows)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.gpu = SampleStore(size, len(GPU_FLOATS), len(GPU_INTS), gpu_convert)
        self.port = SampleStore(size, 0, len(PORT_INTS), port_convert)


# A reading is staged as one packed record: its floats as float64, then its ints
# as int64, None as NaN or ABSENT. The common case packs straight from the fields
# (``pack(g.a, g.b, ...)``: slot loads and one call, no tuple; see
# ``stepwatch.streams.core.packing``), so the fields are named twice: there and in
# _GPU_FIELDS / PORT_COUNTERS for the slower path a None takes
# (``packing.pack_absent``); tests/unit/streams/core/test_hostsamples.py reads both
# back. Ints stay exact (int64 all the way); a value outside int64 raises, as
# NumPy's conversion did.
_GPU_NF = 6  # floats first
_GPU_FMT = "d" * _GPU_NF + "q" * len(GPU_INTS)
_GPU_FIELDS = (
    "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "temp_gpu_c",
    "util_gpu_pct", *GPU_INTS,
)  # fmt: skip
_GPU_VALUES = attrgetter(*_GPU_FIELDS)
_GPU_ABSENT = (float("nan"),) * _GPU_NF + (ABSENT,) * len(GPU_INTS)
_PORT_VALUES = attrgetter(*PORT_COUNTERS)
_PORT_FMT = "q" * len(PORT_INTS)
_PORT_ABSENT = (ABSENT,) * len(PORT_INTS)


def gpu_rows(gpus: Sequence[GpuReading]) -> Raw:
    """Each reading's _GPU_FIELDS (gauges: clock, clock limit, power, power limit,
    temperature, utilisation; ints: GPU_INTS) as one packed record each."""
    pack = layout(_GPU_FMT).pack
    try:
        return [
            pack(
                g.sm_clock_mhz,
                g.sm_clock_max_mhz,
                g.power_w,
                g.power_limit_w,
                g.temp_gpu_c,
                g.util_gpu_pct,
                g.index,
                g.throttle_reasons,
                g.ecc_dbe_total,
                g.remapped_rows_uncorrectable,
            )
            for g in gpus
        ]
    except (struct.error, TypeError):  # a None (or a bad value: raised again below)
        return pack_absent(_GPU_FMT, list(map(_GPU_VALUES, gpus)), _GPU_ABSENT)


def port_rows(ports: Sequence[PortReading], slots: list[tuple[int, int]]) -> Raw:
    """Each port's PORT_INTS as one packed record of int64 (None: ABSENT): its
    ``port_slots`` (key id, state other than ACTIVE), then its PORT_COUNTERS."""
    pack = layout(_PORT_FMT).pack
    pairs = zip(slots, ports, strict=True)
    try:
        return [
            pack(
                kid,
                bad,
                p.np_cnp_sent_total,
                p.rp_cnp_handled_total,
                p.np_ecn_marked_roce_packets_total,
                p.xmit_wait_total,
                p.symbol_error_total,
                p.link_downed_total,
                p.link_error_recovery_total,
                p.rcv_errors_total,
                p.local_link_integrity_errors_total,
            )
            for (kid, bad), p in pairs
        ]
    except (struct.error, TypeError):
        rows = [(*slot, *_PORT_VALUES(p)) for slot, p in zip(slots, ports, strict=True)]
        return pack_absent(_PORT_FMT, rows, _PORT_ABSENT)


def gpu_convert(raw: Raw) -> tuple[np.ndarray, np.ndarray]:
    """Packed GPU records as (floats, ints) rows (see GPU_FLOATS, GPU_INTS)."""
    rows = np.frombuffer(b"".join(raw), np.int64).reshape(-1, len(_GPU_FMT))
    f = rows[:, :_GPU_NF].view(np.float64)
    out = np.empty((len(f), len(GPU_FLOATS)))
    out[:, 0:2] = np.nan
    # the clock and power ratios where the limit is known (> 0; NaN compares False)
    np.divide(f[:, 0], f[:, 1], out=out[:, 0], where=f[:, 1] > 0)
    np.divide(f[:, 2], f[:, 3], out=out[:, 1], where=f[:, 3] > 0)
    out[:, 2:] = f[:, 4:_GPU_NF]
    ints = rows[:, _GPU_NF:].copy()  # a writable copy
    ints[ints[:, 1] == ABSENT, 1] = 0  # no throttle reasons: none
    return out, ints


def port_sig(ports: Sequence[PortReading]) -> list[tuple[Any, ...]]:
    """Each port's identity and link state: (device, port, state, link_downed_total)."""
    return [(p.device, p.port, p.state, p.link_downed_total) for p in ports]


def port_slots(
    sig: list[tuple[Any, ...]], key_of: dict[tuple[str, int], int]
) -> list[tuple[int, int]]:
    """(key id, state other than ACTIVE) of each port of a message from its
    ``port_sig`` tuples; ``key_of`` interns each (device, port) as a small number (adds
    new ones)."""
    out: list[tuple[int, int]] = []
    for device, port, state, _ in sig:
        kid = key_of.get((device, port))
        if kid is None:
            kid = key_of[(device, port)] = len(key_of)
        out.append((kid, 1 if state and state != "ACTIVE" else 0))
    return out


def port_convert(raw: Raw) -> tuple[np.ndarray, np.ndarray]:
    """Packed port records as (no floats, ints) rows (see PORT_INTS)."""
    ints = np.frombuffer(b"".join(raw), np.int64).reshape(-1, len(PORT_INTS))  # read-only
    return np.empty((len(ints), 0)), ints
