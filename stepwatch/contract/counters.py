"""Rates from cumulative counters, with reset and wrap handling.

Host samples carry raw cumulative counters; every consumer computes rates
here so that resets (driver reload, agent restart, a device re-enumerated)
and wraps are handled the same way. Which counters can wrap at 32 bits is the
caller's to say (``wrap``): the mlx5 ``hw_counters`` and NVML's PCIe replay
count; the InfiniBand ``counters/`` saturate, ECC and NVLink counters are 64-bit.
"""

from __future__ import annotations

WRAP_32 = 2**32
# the mlx5 ``hw_counters/`` a port reading carries (RoCE congestion and transport
# errors; 32-bit queue counters, the only port counters that wrap)
HW_COUNTERS: tuple[str, ...] = (
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "duplicate_request",
    "out_of_buffer",
)
# the reading fields (port and GPU) of counters that can wrap at 32 bits: the mlx5
# hw_counters and NVML's PCIe replay count (an unsigned int); the InfiniBand
# ``counters/`` saturate, ECC, row-remap and NVLink counters are 64-bit
WRAPPING: frozenset[str] = frozenset(
    {*(f"{name}_total" for name in HW_COUNTERS), "pcie_replay_total"}
)
WRAP_64 = 2**64


def delta(prev: int | None, cur: int | None, wrap: int | None = None) -> int | None:
    """Increase of a cumulative counter between two readings.

    ``None`` when either reading is missing. A decrease is a wrap when ``wrap``
    is given and the previous value was in the top quarter of its range
    (``cur + wrap - prev``), otherwise a reset: the counter restarted from 0,
    so the increase since the reset is ``cur``.
    """
    if prev is None or cur is None:
        return None
    if cur >= prev:
        return cur - prev
    if wrap is not None and prev >= wrap * 3 // 4:
        return cur + wrap - prev
    return cur


def rate(prev: int | None, cur: int | None, dt: float, wrap: int | None = None) -> float | None:
    """Per-second rate between two readings ``dt`` seconds apart (None if unknown)."""
    if dt <= 0:
        return None
    d = delta(prev, cur, wrap)
    return None if d is None else d / dt
