"""Many hosts' GPU signals at once: the peers a straggler's GPU is compared with.

A straggler's cause compares its GPU with the GPUs of up to 16 peer hosts
(:meth:`stepwatch.streams.core.causes.CauseFinder.for_rank`). Read host by
host (:meth:`HostWindow.gpu_signals`) that is a few dozen NumPy calls and a
Python pass over every reading per host. Here every host of one sample store
is read in one set of NumPy operations over its rows in range, for the common
shape: the same GPUs in the same column slots in every sample of the range,
and no XID or ECC event. The result is exactly what ``gpu_signals`` returns
(the same medians, quartile, shares and counter increases, as the same
floats); a host of any other shape gets ``None``, and the caller reads it
with ``gpu_signals``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stepwatch.contract import EventType
from stepwatch.streams.core.hostsamples import ABSENT, GPU_FLOATS, GPU_INTS, SampleStore
from stepwatch.streams.core.hostwindow import THROTTLE_NAMES, GpuSignals, View

_CLOCK, _POWER, _TEMP, _UTIL = map(
    GPU_FLOATS.index, ("sm_clock_ratio", "power_ratio", "temp_gpu_c", "util_gpu_pct")
)
_INDEX, _THROTTLE, _DBE, _REMAP = map(
    GPU_INTS.index, ("index", "throttle_reasons", "ecc_dbe_total", "remapped_rows_uncorrectable")
)
_BITS = np.array(list(THROTTLE_NAMES), np.int64)
_CAUSE_EVENTS = (EventType.XID, EventType.ECC)
# hosts read in one pass: bounds its copies of the rows (a job's 2,048 hosts at once
# would copy ~130 MB of samples; 64 hosts, ~4 MB)
CHUNK_HOSTS = 64


def gpu_signals_many(views: Sequence[View]) -> list[dict[int, GpuSignals] | None]:
    """Each view's ``HostWindow.gpu_signals(t0, t1)``, or None where it must be read so."""
    out: list[dict[int, GpuSignals] | None] = [None] * len(views)
    by_store: dict[int, list[int]] = {}
    for i, (win, t0, t1) in enumerate(views):
        if win.events and win.events_in(t0, t1, *_CAUSE_EVENTS):
            continue  # XIDs and ECC events join the signals: the host's own path
        by_store.setdefault(id(win.gpu.store), []).append(i)
    for members in by_store.values():
        for at in range(0, len(members), CHUNK_HOSTS):
            part = members[at : at + CHUNK_HOSTS]
            for i, signals in zip(part, _store_signals(views, part), strict=True):
                out[i] = signals
    return out


def _store_signals(views: Sequence[View], members: list[int]) -> list[dict[int, GpuSignals] | None]:
    store: SampleStore = views[members[0]][0].gpu.store
    store.flush()
    slots = np.array([views[i][0].gpu.slot for i in members], np.intp)
    t0 = np.array([views[i][1] for i in members])[:, None]
    t1 = np.array([views[i][2] for i in members])[:, None]
    size = store.size
    count = store.count[slots][:, None]
    rows = (store.pos[slots][:, None] - count + np.arange(size)) % size  # arrival order
    t = store.ts[slots[:, None], rows]
    inside = (np.arange(size) < count) & (t0 <= t) & (t <= t1)
    # only the rows in range, every host's together (arrival order kept), then split
    floats, ints = store.at(np.broadcast_to(slots[:, None], rows.shape)[inside], rows[inside])
    ends = np.cumsum(inside.sum(axis=1)).tolist()
    starts = [0, *ends[:-1]]
    return [
        _host(ints[a:b], floats[a:b]) if b > a else {} for a, b in zip(starts, ends, strict=True)
    ]


def _host(ints: np.ndarray, floats: np.ndarray) -> dict[int, GpuSignals] | None:
    """One host's signals from its rows in range (arrival order), or None when they do
    not hold the same GPUs in the same column slots."""
    index = ints[:, :, _INDEX]
    cols = np.flatnonzero(index[0] != ABSENT)
    if (index != index[0]).any() or len(set(index[0, cols].tolist())) != len(cols):
        return None
    ints, floats = ints[:, cols], floats[:, cols]
    n = len(ints)
    dbe, remap = _increases(ints[:, :, _DBE]), _increases(ints[:, :, _REMAP])
    if dbe is None or remap is None:
        return None
    shares = ((ints[:, :, _THROTTLE, None] & _BITS) != 0).sum(axis=0) / n  # (gpus, bits)
    clock_med, clock_low = _medians(floats[:, :, _CLOCK], quartile=True)
    temp, _ = _medians(floats[:, :, _TEMP])
    power, _ = _medians(floats[:, :, _POWER])
    util, _ = _medians(floats[:, :, _UTIL])
    bits = list(THROTTLE_NAMES)
    found = {
        int(g): GpuSignals(
            samples=n,
            throttle_share=dict(zip(bits, shares[j].tolist(), strict=True)),
            sm_clock_ratio=clock_med[j],
            sm_clock_ratio_low=clock_low[j],
            temp_c=temp[j],
            power_ratio=power[j],
            util_pct=util[j],
            ecc_dbe=dbe[j],
            remapped_uncorrectable=remap[j],
            xids=(),
        )
        for j, g in enumerate(index[0, cols].tolist())
    }
    order = set(dict.fromkeys(sorted(found))) | set()  # as gpu_signals orders them
    return {g: found[g] for g in order}


def _medians(
    values: np.ndarray, quartile: bool = False
) -> tuple[list[float | None], list[float | None]]:
    """Per column of ``values`` (rows, gpus; NaN: no reading): the median of its readings
    and, with ``quartile``, the one a quarter up (as ``median_of`` and ``sorted(...)[n //
    4]`` give them on the readings in arrival order; None: none)."""
    s = np.sort(values, axis=0, kind="stable")  # NaN last
    k = (~np.isnan(values)).sum(axis=0)
    cols = np.arange(values.shape[1])
    h = k // 2
    hi = s[np.minimum(h, len(s) - 1), cols]
    lo = s[np.maximum(h - 1, 0), cols]
    med = np.where(k % 2 == 1, hi, (lo + hi) / 2).tolist()
    low = s[k // 4, cols].tolist() if quartile else []
    none = (k == 0).tolist()
    return (
        [None if e else m for m, e in zip(med, none, strict=True)],
        [None if e else q for q, e in zip(low, none, strict=True)] if quartile else [],
    )


def _increases(values: np.ndarray) -> list[int] | None:
    """Per column (rows, gpus; ABSENT: no reading): a cumulative counter's increase over its
    readings, when every column's readings never decrease (then ``_increase`` sums to the
    last minus the first); None when one does (a reset or a wrap: the host's own path)."""
    seen = values != ABSENT
    low = np.iinfo(np.int64).min
    kept = np.where(seen, values, low)
    before = np.maximum.accumulate(kept, axis=0)
    if (seen[1:] & (values[1:] < before[:-1])).any():
        return None
    top = before[-1]
    first = np.where(seen, values, np.iinfo(np.int64).max).min(axis=0)
    return np.where(seen.any(axis=0), top - first, 0).tolist()  # type: ignore[no-any-return]
