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

from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from stepwatch.contract import GpuReading, PortReading

ABSENT = -1  # an int column's "no value" (None, or no reading in this slot)

# GPU: gauges as floats, then index and counters as ints
GPU_FLOATS = ("sm_clock_ratio", "power_ratio", "temp_gpu_c", "util_gpu_pct")
GPU_INTS = ("index", "throttle_reasons", "ecc_dbe_total", "remapped_rows_uncorrectable")
_GPU_RAW = attrgetter("sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w",
                      "temp_gpu_c", "util_gpu_pct")
_GPU_COUNTERS = attrgetter("ecc_dbe_total", "remapped_rows_uncorrectable")

# ports: the port's key id, a state other than ACTIVE, then the counters the signals read
PORT_COUNTERS = ("np_cnp_sent_total", "rp_cnp_handled_total",
                 "np_ecn_marked_roce_packets_total", "xmit_wait_total",
                 "symbol_error_total", "link_downed_total", "link_error_recovery_total",
                 "rcv_errors_total", "local_link_integrity_errors_total")
PORT_INTS = ("key", "bad_state", *PORT_COUNTERS)
_PORT_COUNTERS = attrgetter(*PORT_COUNTERS)


class SampleRing:
    """The last ``size`` samples: a timestamp per row, ``width`` reading slots per row.

    ``floats`` is (size, width, n_floats), ``ints`` (size, width, n_ints); a slot with
    ``ints[..., 0] == ABSENT`` holds no reading. ``width`` grows to the widest message.
    """

    def __init__(self, size: int, n_floats: int, n_ints: int) -> None:
        self.size = size
        self.ts = np.full(size, np.nan)
        self.floats = np.full((size, 0, n_floats), np.nan)
        self.ints = np.full((size, 0, n_ints), ABSENT, dtype=np.int64)
        self.pos = 0  # next row to write
        self.count = 0  # rows written, capped at size

    def __len__(self) -> int:
        return self.count

    def push(self, ts: float, floats: np.ndarray | None, ints: np.ndarray) -> None:
        """Write one sample over the oldest: ``ints`` (n, n_ints), ``floats`` (n, n_floats)."""
        n = len(ints)
        if n > self.ints.shape[1]:
            self._widen(n)
        row = self.pos
        self.ts[row] = ts
        self.ints[row, :n] = ints
        self.ints[row, n:] = ABSENT
        if floats is not None:
            self.floats[row, :n] = floats
            self.floats[row, n:] = np.nan
        self.pos = (row + 1) % self.size
        if self.count < self.size:
            self.count += 1

    def _widen(self, width: int) -> None:
        extra = width - self.ints.shape[1]
        self.ints = np.concatenate(
            [self.ints, np.full((self.size, extra, self.ints.shape[2]), ABSENT, np.int64)], 1)
        self.floats = np.concatenate(
            [self.floats, np.full((self.size, extra, self.floats.shape[2]), np.nan)], 1)

    def order(self) -> np.ndarray:
        """Row numbers in arrival order, oldest first."""
        start = (self.pos - self.count) % self.size
        return (start + np.arange(self.count)) % self.size


def gpu_row(gpus: Sequence[GpuReading]) -> tuple[np.ndarray, np.ndarray]:
    """One GPU message's readings as (floats, ints) rows (see GPU_FLOATS, GPU_INTS)."""
    raw = np.array([_GPU_RAW(g) for g in gpus], dtype=float).reshape(-1, 6)  # None -> NaN
    with np.errstate(divide="ignore", invalid="ignore"):
        clock = np.where(raw[:, 1] > 0, raw[:, 0] / raw[:, 1], np.nan)  # NaN max: NaN
        power = np.where(raw[:, 3] > 0, raw[:, 2] / raw[:, 3], np.nan)
    floats = np.column_stack((clock, power, raw[:, 4], raw[:, 5]))
    ints = np.array([(g.index, g.throttle_reasons or 0,
                      *(ABSENT if v is None else v for v in _GPU_COUNTERS(g))) for g in gpus],
                    dtype=np.int64).reshape(-1, len(GPU_INTS))
    return floats, ints


def port_row(ports: Sequence[PortReading], key_of: dict[tuple[str, int], int]) -> np.ndarray:
    """One port message's readings as an ints row (see PORT_INTS); ``key_of`` interns
    each (device, port) as a small number (new ones are added)."""
    rows = []
    for p in ports:
        key = (p.device, p.port)
        kid = key_of.get(key)
        if kid is None:
            kid = key_of[key] = len(key_of)
        bad = 1 if p.state and p.state != "ACTIVE" else 0
        rows.append((kid, bad, *(ABSENT if v is None else v for v in _PORT_COUNTERS(p))))
    return np.array(rows, dtype=np.int64).reshape(-1, len(PORT_INTS))


def values(column: list[int]) -> list[int | None]:
    """An int column's Python values, ABSENT back to None."""
    return [None if v == ABSENT else v for v in column]
