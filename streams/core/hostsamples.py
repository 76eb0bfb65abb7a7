"""Compact rings of one host's GPU and port samples: only the fields the causes read.

A decoded :class:`~stepwatch.contract.GpuMessage` of 8 readings takes about
7.6 KB of Python objects and a :class:`~stepwatch.contract.PortMessage` of 8
ports about 6.2 KB; kept for ``host_samples`` (128) samples per host they were
~220 KB per rank of a large job. Here each sample is one row of fixed-size
NumPy arrays: one column slot per reading of the message (in message order),
float64 for gauges (NaN: absent) and int64 for counters and indices (-1:
absent; contract counters are at most 2**63 - 1, so both are exact). The
readers get back plain Python values, identical to the message's, in arrival
order: :mod:`stepwatch.streams.core.hostwindow` computes the signals from them
exactly as it did from the messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from stepwatch.contract import GpuReading, PortReading

ABSENT = -1  # an int column's "no value" (None, or no reading in this slot)

# GPU: gauges as floats, then index and counters as ints
GPU_FLOATS = ("sm_clock_ratio", "power_ratio", "temp_gpu_c", "util_gpu_pct")
GPU_INTS = ("index", "throttle_reasons", "ecc_dbe_total", "remapped_rows_uncorrectable")

# ports: the port's key id, a state other than ACTIVE, then the counters the signals read
PORT_COUNTERS = ("np_cnp_sent_total", "rp_cnp_handled_total",
                 "np_ecn_marked_roce_packets_total", "xmit_wait_total",
                 "symbol_error_total", "link_downed_total", "link_error_recovery_total",
                 "rcv_errors_total", "local_link_integrity_errors_total")
PORT_INTS = ("key", "bad_state", *PORT_COUNTERS)


Raw = list[tuple[Any, ...]]  # the readings' numeric fields, as attrgetter gives them
Convert = Callable[[np.ndarray, Raw, np.ndarray | None], tuple[np.ndarray, np.ndarray]]
EXACT = 2.0**53  # integers below this convert to float64 and back exactly


class SampleRing:
    """The last ``size`` samples: a timestamp per row, ``width`` reading slots per row.

    ``floats`` is (size, width, n_floats), ``ints`` (size, width, n_ints); a slot with
    ``ints[..., 0] == ABSENT`` holds no reading. ``width`` grows to the widest message.
    Samples are staged as the readings' raw tuples and written ``STAGE`` at a time (one
    NumPy conversion for all of them): a reader calls :meth:`order` first.
    """

    STAGE = 8

    def __init__(self, size: int, n_floats: int, n_ints: int, convert: Convert) -> None:
        self.size = size
        self.convert = convert
        self.ts = np.full(size, np.nan)
        self.floats = np.full((size, 0, n_floats), np.nan)
        self.ints = np.full((size, 0, n_ints), ABSENT, dtype=np.int64)
        self.pos = 0  # next row to write
        self.count = 0  # rows written, capped at size
        self._staged: list[tuple[float, Raw, list[tuple[int, ...]] | None]] = []

    def __len__(self) -> int:
        return self.count + len(self._staged)

    def add(self, ts: float, raw: Raw, slots: list[tuple[int, ...]] | None = None) -> None:
        """Stage one sample: its readings' numeric tuples and (optionally) small ints of
        each reading worked out by the caller (``convert`` takes both)."""
        self._staged.append((ts, raw, slots))
        if len(self._staged) >= self.STAGE:
            self.flush()

    def flush(self) -> None:
        """Write the staged samples into the arrays."""
        staged = self._staged
        if not staged:
            return
        self._staged = []
        m = len(staged)
        counts = [len(raw) for _, raw, _ in staged]
        raw = [x for _, r, _ in staged for x in r]
        slots = None if staged[0][2] is None else np.array(
            [x for _, _, sl in staged for x in sl or ()], dtype=np.int64)
        floats, ints = self.convert(np.array(raw, dtype=float), raw, slots)  # None: NaN
        width = max(counts)
        if width > self.ints.shape[1]:
            self._widen(width)
        if min(counts) == width == self.ints.shape[1] and self.pos + m <= self.size:
            lo, hi = self.pos, self.pos + m  # the common case: one slice of whole rows
            self.ts[lo:hi] = [ts for ts, _, _ in staged]
            self.ints[lo:hi] = ints.reshape(m, width, self.ints.shape[2])
            self.floats[lo:hi] = floats.reshape(m, width, self.floats.shape[2])
            self._advance(m)
            return
        lo = 0
        for (ts, _, _), n in zip(staged, counts, strict=True):
            self._push(ts, floats[lo:lo + n], ints[lo:lo + n])
            lo += n

    def _push(self, ts: float, floats: np.ndarray, ints: np.ndarray) -> None:
        n, row = len(ints), self.pos
        self.ts[row] = ts
        self.ints[row, :n] = ints
        self.ints[row, n:] = ABSENT
        self.floats[row, :n] = floats
        self.floats[row, n:] = np.nan
        self._advance(1)

    def _advance(self, rows: int) -> None:
        self.pos = (self.pos + rows) % self.size
        self.count = min(self.count + rows, self.size)

    def _widen(self, width: int) -> None:
        extra = width - self.ints.shape[1]
        self.ints = np.concatenate(
            [self.ints, np.full((self.size, extra, self.ints.shape[2]), ABSENT, np.int64)], 1)
        self.floats = np.concatenate(
            [self.floats, np.full((self.size, extra, self.floats.shape[2]), np.nan)], 1)

    def order(self) -> np.ndarray:
        """Row numbers in arrival order, oldest first (staged samples written first)."""
        self.flush()
        start = (self.pos - self.count) % self.size
        return (start + np.arange(self.count)) % self.size


def exact_ints(f: np.ndarray, raw: Raw, lo: int) -> np.ndarray:
    """Columns ``lo:`` of the readings as int64 (None: ABSENT): from their float64 copy
    ``f`` when every value is below 2**53 (exact), from the Python ints otherwise."""
    part = f[:, lo:]
    if part.max(initial=0.0) < EXACT:  # NaN: see below
        out = part.astype(np.int64)
        out[np.isnan(part)] = ABSENT
        return out
    if not (part >= EXACT).any():  # the maximum was NaN, every value is below
        return np.where(np.isnan(part), ABSENT, part).astype(np.int64)
    return np.array([[ABSENT if v is None else v for v in r[lo:]] for r in raw],
                    dtype=np.int64).reshape(part.shape)


# a GPU reading's numeric fields: the gauges, then index, throttle reasons, counters
_GPU_RAW = attrgetter("sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w",
                      "temp_gpu_c", "util_gpu_pct", "index", "throttle_reasons",
                      "ecc_dbe_total", "remapped_rows_uncorrectable")
_GPU_NF = 6  # floats first
_GPU_N = _GPU_NF + len(GPU_INTS)


def gpu_raw(gpus: Sequence[GpuReading]) -> Raw:
    return list(map(_GPU_RAW, gpus))


def gpu_convert(f: np.ndarray, raw: Raw, slots: np.ndarray | None) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """GPU readings as (floats, ints) rows (see GPU_FLOATS, GPU_INTS)."""
    f = f.reshape(-1, _GPU_N)
    out = np.empty((len(f), len(GPU_FLOATS)))
    out[:, 0:2] = np.nan
    # the clock and power ratios where the limit is known (> 0; NaN compares False)
    np.divide(f[:, 0], f[:, 1], out=out[:, 0], where=f[:, 1] > 0)
    np.divide(f[:, 2], f[:, 3], out=out[:, 1], where=f[:, 3] > 0)
    out[:, 2:] = f[:, 4:_GPU_NF]
    ints = exact_ints(f, raw, _GPU_NF)
    ints[ints[:, 1] == ABSENT, 1] = 0  # no throttle reasons: none
    return out, ints


_PORT_RAW = attrgetter(*PORT_COUNTERS)
PORT_SIG = attrgetter("device", "port", "state", "link_downed_total")  # a port's identity


def port_raw(ports: Sequence[PortReading]) -> Raw:
    return list(map(_PORT_RAW, ports))


def port_slots(sig: list[tuple[Any, ...]],
               key_of: dict[tuple[str, int], int]) -> list[tuple[int, ...]]:
    """(key id, state other than ACTIVE) of each port of a message from its PORT_SIG
    tuples; ``key_of`` interns each (device, port) as a small number (adds new ones)."""
    out: list[tuple[int, ...]] = []
    for device, port, state, _ in sig:
        kid = key_of.get((device, port))
        if kid is None:
            kid = key_of[(device, port)] = len(key_of)
        out.append((kid, 1 if state and state != "ACTIVE" else 0))
    return out


def port_convert(f: np.ndarray, raw: Raw, slots: np.ndarray | None) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """Port readings as (no floats, ints) rows (see PORT_INTS)."""
    f = f.reshape(-1, len(PORT_COUNTERS))
    assert slots is not None
    ints = np.hstack((slots.reshape(-1, 2), exact_ints(f, raw, 0)))
    return np.empty((len(f), 0)), ints
