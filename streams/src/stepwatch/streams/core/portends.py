"""The periodic network check's first pass: every port of a job's hosts at once.

:func:`stepwatch.streams.core.netloc.port_suspects` compares each port's
congestion rates with the median of the job's ports. Reading every host with
:meth:`HostWindow.port_signals` (``ends_only``) made a dozen small NumPy calls
and eight :class:`PortSignals` per host, every check, for ports that almost
never stand out. Here the same rates come from one set of NumPy operations over
all the hosts' rows of the shared sample store: each host's first and last
sample in its range (found exactly as ``HostWindow._ends`` finds them, newest
first, the scan stopping ``ORDER_SLACK_S`` before the range) and the counters'
rises between them (:func:`rises_of`). Nothing is judged here: a host that
could hold a suspect is read again with ``port_signals`` by the caller, so a
detection is built from exactly the values it was built from before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stepwatch.streams.core.hostsamples import ABSENT, SampleStore
from stepwatch.streams.core.hostwindow import COUNTER_COLS, ORDER_SLACK_S, View, rises_of


@dataclass(frozen=True)
class PortRates:
    """The rates of every port of the hosts read, one entry per port (``host`` is the
    index of its host in the views), and per host whether it must be read port by port:
    ``flagged`` (a port in a state other than ACTIVE, an error counter that rose, or a
    link-down event in the range) or ``irregular`` (its first and last samples hold
    different ports: their rates are not here)."""

    host: np.ndarray
    cnp_per_s: np.ndarray
    xmit_wait_per_s: np.ndarray
    flagged: np.ndarray
    irregular: np.ndarray


def port_rates(views: Sequence[View]) -> PortRates:
    """:class:`PortRates` of ``views``, whose windows share one sample store or not."""
    k = len(views)
    parts: list[tuple[np.ndarray, ...]] = []
    flagged = np.zeros(k, bool)
    irregular = np.zeros(k, bool)
    by_store: dict[int, list[int]] = {}
    for i, (win, t0, t1) in enumerate(views):
        by_store.setdefault(id(win.port.store), []).append(i)
        if win.events and win.link_downs(t0, t1):
            flagged[i] = True
    for members in by_store.values():
        parts.append(_store_rates(views, np.array(members), flagged, irregular))
    if not parts:
        empty = np.zeros(0)
        return PortRates(np.zeros(0, np.intp), empty, empty, flagged, irregular)
    host, cnp, wait = (np.concatenate(c) for c in zip(*parts, strict=True))
    order = np.argsort(host, kind="stable")
    return PortRates(host[order], cnp[order], wait[order], flagged, irregular)


def _store_rates(
    views: Sequence[View], members: np.ndarray, flagged: np.ndarray, irregular: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The ports of the views ``members`` (one store): their host, CNP and xmit_wait rates;
    marks ``flagged`` and ``irregular`` in place."""
    store: SampleStore = views[members[0]][0].port.store
    store.flush()
    slots = np.array([views[i][0].port.slot for i in members], np.intp)
    t0 = np.array([views[i][1] for i in members])
    t1 = np.array([views[i][2] for i in members])
    found = _ends(store, slots, t0, t1)
    if found is None:
        return np.zeros(0, np.intp), np.zeros(0), np.zeros(0)
    has, first, last = found
    members, slots = members[has], slots[has]
    a, b = store.at(slots, first)[1], store.at(slots, last)[1]  # (hosts, width, PORT_INTS)
    regular = (a[:, :, 0] == b[:, :, 0]).all(axis=1)
    irregular[members[~regular]] = True
    members, slots, first, last = members[regular], slots[regular], first[regular], last[regular]
    a, b = a[regular], b[regular]
    span = store.ts[slots, last] - store.ts[slots, first]
    rise = rises_of(a[:, :, COUNTER_COLS], b[:, :, COUNTER_COLS])
    keep = a[:, :, 0] != ABSENT
    bad = (rise[:, :, 4:].any(axis=2) | (a[:, :, 1] != 0) | (b[:, :, 1] != 0)) & keep
    flagged[members[bad.any(axis=1)]] = True
    per = np.where(span > 0, span, 1.0)[:, None]
    cnp = np.where(span[:, None] > 0, rise[:, :, :3].sum(axis=2) / per, 0.0)
    wait = np.where(span[:, None] > 0, rise[:, :, 3] / per, 0.0)
    host = np.broadcast_to(members[:, None], keep.shape)
    return host[keep], cnp[keep], wait[keep]


def _ends(
    store: SampleStore, slots: np.ndarray, t0: np.ndarray, t1: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per slot: whether it has a sample in its [t0, t1], and the rows of the first and
    the last of them (of equal times, the newest to arrive), as ``HostWindow._ends``."""
    size = store.size
    back = np.arange(size)
    rows = (store.pos[slots][:, None] - 1 - back) % size  # newest first
    t = store.ts[slots[:, None], rows]
    t[back >= store.count[slots][:, None]] = np.nan
    old = t < (t0 - ORDER_SLACK_S)[:, None]
    cut = np.where(old.any(axis=1), old.argmax(axis=1), size)
    inside = (back < cut[:, None]) & (t0[:, None] <= t) & (t <= t1[:, None])
    has = inside.any(axis=1)
    if not has.any():
        return None
    rows, t, inside = rows[has], t[has], inside[has]
    pick = np.arange(len(rows))
    first = rows[pick, np.where(inside, t, np.inf).argmin(axis=1)]
    last = rows[pick, np.where(inside, t, -np.inf).argmax(axis=1)]
    return has, first, last
