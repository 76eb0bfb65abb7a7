"""Job (or peer-group) slowdown: the job against its own history (NVRx "individual").

A straggler makes every peer wait, so the job's step time grows with it; that
is not a job slowdown. The job metric is therefore the *straggler-free* step
time: ``median(busy) + min(comm_wait) + min(other)`` over the ranks, where
``min(comm_wait)`` is the wait of the slowest rank, i.e. the collective's own
cost, and ``min(other)`` drops the unexplained time a late rank's tail puts on
its peers. Without ``comm_wait`` (PyTorch DDP: the wait is inside backward)
the backward term is the *shortest* backward (the rank that waited least:
its own backward compute plus the collective's tail) and the other phases
are medians. It grows when every rank computes slower (power capping across the
fleet, a slower input pipeline everywhere) or when the collective itself is
slower (network congestion), not when one rank holds the others up. Without
phases it is the median step duration.

The baseline is the median of up to ``baseline_steps`` earlier unflagged steps,
so a slowdown never becomes its own baseline; the verdict needs ``k`` of the
last ``n`` steps flagged and the median ratio of those ``n`` above threshold.
Per-group medians of busy time name the group when only one slowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepwatch.streams.core.assembly import (
    BUSY,
    BWD,
    COMPUTE,
    CPUT,
    CPUW,
    DATA,
    DUR,
    EXTRA,
    FWD,
    OPT,
    OTHER,
    PAUSE,
    XFER,
    ClosedStep,
)
from stepwatch.streams.core.causes import CpuUse, waiting_share
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.ranks import GroupIndex
from stepwatch.streams.core.ring import Ring
from stepwatch.streams.core.stats import colmed, mad_sigma, med, nanmed, nmin

REBASE_STEPS = 4
ONSET_TRAIL_WINDOWS = 4  # the onset is looked for over this many windows of ratios
COMPONENTS = ("step", "busy", "data", "compute", "transfer", "collective", "other")


@dataclass(frozen=True, slots=True)
class Slowdown:
    score: float  # median ratio over the window - 1 (0.10 = 10 % slower)
    threshold: float
    group: str  # the one group that slowed, "" for the whole job
    baseline_s: float
    current_s: float
    deltas: dict[str, float]  # component -> seconds added per step vs baseline
    # (cpu_wait, cpu_time) per step at the baseline and now (medians over the ranks of
    # the host whose waiting share rose most), None when the SDK does not report them
    cpu: CpuUse | None = None
    cpu_host: str = ""


class SlowdownTracker:
    def __init__(self, cfg: DetectConfig) -> None:
        self.cfg = cfg
        self.history = Ring(cfg.baseline_steps, len(COMPONENTS))
        self.recent = Ring(cfg.window_steps, len(COMPONENTS))
        self.ratios = Ring(cfg.window_steps, 1)
        # a longer trail of ratios for the onset: a slowdown near the threshold can take more
        # than one window to qualify, and its change point lies before that window
        self.trail = Ring(ONSET_TRAIL_WINDOWS * cfg.window_steps, 1)
        self.flags = Ring(cfg.window_steps, 1, fill=0)
        self.group_history: Ring | None = None
        self.group_recent: Ring | None = None
        self.cpu_history: Ring | None = None  # (cpu_wait, cpu_time) medians per host
        self.cpu_recent: Ring | None = None
        self._hosts_version = -1
        self._groups_version = -1
        self.baseline: float | None = None  # straggler-free step time (unflagged steps' median)
        self.baseline_data = 0.0  # the data phase of those steps (median)
        self.threshold = cfg.slowdown_min_excess
        self.cadence: float | None = None  # median step duration (for hang limits)
        self._stale = 0  # history rows added since the baseline was computed
        self._host_names: tuple[str, ...] = ()
        self._host_index: np.ndarray | None = None  # (hosts, ranks) when hosts are equal
        self.group_base: np.ndarray | None = None  # baseline median busy time per group
        self._run = SlowRun(_run_gap(cfg))

    def on_restart(self) -> None:
        """A restart from a checkpoint: the recent window and its flags belong to the old run
        (the baseline, the job's own history, is kept)."""
        for ring in (
            self.recent,
            self.ratios,
            self.trail,
            self.flags,
            self.group_recent,
            self.cpu_recent,
        ):
            if ring is not None:
                ring.clear()
        self._run = SlowRun(self._run.gap)

    def update(
        self, cs: ClosedStep, groups: GroupIndex, busy: np.ndarray, hosts: GroupIndex | None = None
    ) -> None:
        """Add a closed step; ``hosts`` (the ranks of each host) localizes CPU contention."""
        comps = _components(cs)
        gmed = _group_medians(cs, busy, groups)
        if groups.version != self._groups_version:
            self._groups_version = groups.version
            self.group_history = Ring(self.cfg.baseline_steps, len(groups.names))
            self.group_recent = Ring(self.cfg.window_steps, len(groups.names))
            self.group_base = None
        hosts = groups if hosts is None else hosts
        if hosts.version != self._hosts_version or self.cpu_history is None:
            self._hosts_version = hosts.version
            self._host_names = hosts.names
            same = len({len(idx) for idx in hosts.members}) == 1
            self._host_index = np.stack(hosts.members) if same and len(hosts.members) > 1 else None
            self.cpu_history = Ring(self.cfg.baseline_steps, (2, len(hosts.names)))
            self.cpu_recent = Ring(self.cfg.window_steps, (2, len(hosts.names)))
        assert self.group_history is not None and self.group_recent is not None
        assert self.cpu_recent is not None
        cpu = _host_cpu(cs, hosts, self._host_index)
        self.recent.push(comps)
        self.group_recent.push(gmed)
        self.cpu_recent.push(cpu)
        if self._stale >= REBASE_STEPS or (self.baseline is None and self._stale):
            self._rebase()
        base = self.baseline
        ratio = comps[0] / base - 1.0 if base else float("nan")
        if self.group_base is not None and len(gmed) > 1 and not np.isnan(gmed).all():
            with np.errstate(divide="ignore", invalid="ignore"):
                worst = np.nanmax(gmed / self.group_base) - 1.0  # one stage slower: its own ratio
            if worst > ratio:
                ratio = float(worst)
        flagged = bool(ratio > self.threshold)
        self._run.update(ratio > self.threshold / 2, cs.end_max)
        self.ratios.push(ratio)
        self.trail.push(ratio)
        self.flags.push(1.0 if flagged else 0.0)
        if not flagged and not np.isnan(comps[0]):
            self.history.push(comps)
            self.group_history.push(gmed)
            self.cpu_history.push(cpu)
            self._stale += 1
        if self.baseline is not None:
            self.cadence = self.baseline
        elif not np.isnan(comps[0]):
            self.cadence = med(self.recent.filled()[:, 0])

    def _rebase(self) -> None:
        """Baseline and threshold from the history (every few steps: it moves slowly)."""
        self._stale = 0
        hist = self.history.filled()
        if len(hist) < self.cfg.min_baseline_steps:
            return
        steps = hist[:, 0]
        base = med(steps)
        if not base > 0:
            return
        self.baseline = base
        data = hist[:, 2]
        self.baseline_data = med(data) if not np.isnan(data).all() else 0.0
        if self.group_history is not None and self.group_history.count:
            self.group_base = colmed(self.group_history.filled())
        spread = mad_sigma(steps, base) / base
        self.threshold = max(self.cfg.slowdown_min_excess, self.cfg.slowdown_z * spread)

    def candidate(self, groups: GroupIndex) -> Slowdown | None:
        """A slowdown when k of the last n steps were flagged, their median ratio is high and
        the run of slow steps has lasted ``slowdown_min_seconds`` of the job's time."""
        if self.baseline is None or self.flags.filled().sum() < self.cfg.slowdown_persist_steps:
            return None
        if self._run.seconds() < self.cfg.slowdown_min_seconds:
            return None
        return self._verdict(groups, self.threshold)

    def still_slow(self, groups: GroupIndex) -> Slowdown | None:
        """The current slowdown while it holds (hysteresis for an open detection)."""
        if self.baseline is None:
            return None
        return self._verdict(groups, self.threshold * self.cfg.straggler_clear_ratio)

    def onset_back(self) -> int:
        """How many steps before the last one the slowdown began: the start of the trailing
        run of steps whose ratio to the baseline is above half the threshold (one step
        below it does not end the run), over the last few windows."""
        ratios = self.trail.last(self.trail.count)[:, 0]
        if not len(ratios):
            return 0
        return trailing_run(ratios, self.threshold / 2)

    def impact(self) -> dict[str, float | None]:
        """The job's change against its baseline now, however small: ``ratio`` (median over
        the window of the straggler-free step time's ratio - 1) and ``collective`` (seconds
        per step the collective added); None where unknown."""
        if self.baseline is None:
            return {"ratio": None, "collective": None}
        score = med(self.ratios.filled()[:, 0])
        i = COMPONENTS.index("collective")
        grew = med(self.recent.filled()[:, i]) - med(self.history.filled()[:, i])
        return {
            "ratio": round(score, 4) if score == score else None,
            "collective": round(grew, 6) if grew == grew else None,
        }

    def _verdict(self, groups: GroupIndex, threshold: float) -> Slowdown | None:
        score = med(self.ratios.filled()[:, 0])
        if not score > threshold or self.baseline is None:
            return None
        base = colmed(self.history.filled())
        now = colmed(self.recent.filled())
        deltas = {
            name: round(float(now[i] - base[i]), 6)
            for i, name in enumerate(COMPONENTS)
            if not np.isnan(now[i] - base[i])
        }
        cpu, cpu_host = self._cpu_use()
        group, g_base, g_now = self._slow_group(groups)
        if group:  # report the group's own busy time
            return Slowdown(score, self.threshold, group, g_base, g_now, deltas, cpu, cpu_host)
        return Slowdown(
            score, self.threshold, "", self.baseline, float(now[0]), deltas, cpu, cpu_host
        )

    def _cpu_use(self) -> tuple[CpuUse | None, str]:
        """(cpu_wait, cpu_time) at the baseline and now of the host whose waiting share
        rose most (CPU contention is a host's: other processes on its cores)."""
        if self.cpu_history is None or self.cpu_recent is None or not self.cpu_history.count:
            return None, ""
        base = nanmed(self.cpu_history.filled(), 0)  # (2, groups)
        now = nanmed(self.cpu_recent.filled(), 0)
        rise = waiting_share(now[0], now[1]) - waiting_share(base[0], base[1])
        if np.isnan(rise).all():
            return None, ""
        g = int(np.nanargmax(rise))
        use = ((float(base[0, g]), float(base[1, g])), (float(now[0, g]), float(now[1, g])))
        return use, self._host_names[g]

    def _slow_group(self, groups: GroupIndex) -> tuple[str, float, float]:
        """The one group whose busy time grew while the others' did not."""
        if len(groups.names) < 2 or self.group_history is None or self.group_recent is None:
            return "", 0.0, 0.0
        base = colmed(self.group_history.filled())
        now = colmed(self.group_recent.filled())
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = now / base - 1.0
        slow = np.flatnonzero(ratio > self.threshold)
        calm = np.flatnonzero(ratio <= self.threshold / 2)
        if len(slow) == 1 and len(calm) == len(groups.names) - 1:
            g = int(slow[0])
            return groups.names[g], float(base[g]), float(now[g])
        return "", 0.0, 0.0


def _run_gap(cfg: DetectConfig) -> int:
    """Steps back at or below the level that do not end a slow run: as many as a window
    that qualifies (k of n flagged) may hold, so such a window never splits a run."""
    return max(1, cfg.window_steps - cfg.slowdown_persist_steps)


class SlowRun:
    """How long the trailing run of slow steps has lasted, in event time, kept as the steps
    come so that it can outlast the ratio rings: up to ``gap`` consecutive steps at or
    below the level do not end it (as in :func:`trailing_run`)."""

    __slots__ = ("below", "gap", "last_ts", "start_ts")

    def __init__(self, gap: int = 1) -> None:
        self.gap = gap
        self.start_ts: float | None = None  # when the run's first step began
        self.last_ts: float | None = None  # the end of the latest step
        self.below = 0

    def update(self, slow: bool, ts: float) -> None:
        """The step that ended at ``ts``: slow or not."""
        if slow:
            if self.start_ts is None:  # it began when the step before it ended
                self.start_ts = ts if self.last_ts is None else self.last_ts
            self.below = 0
        elif self.start_ts is not None:
            self.below += 1
            if self.below > self.gap:
                self.start_ts = None
        self.last_ts = ts

    def seconds(self) -> float:
        if self.start_ts is None or self.last_ts is None:
            return 0.0
        return self.last_ts - self.start_ts


def _host_cpu(cs: ClosedStep, hosts: GroupIndex, index: np.ndarray | None) -> np.ndarray:
    """Median (cpu_wait, cpu_time) of the ranks of each host (the job's when one);
    ``index``: the (hosts, ranks) index when every host has as many ranks."""
    if len(hosts.members) == 1:
        return cs.med[[CPUW, CPUT]][:, None]
    m = cs.m
    if np.isnan(m[CPUW]).all() and np.isnan(m[CPUT]).all():
        return np.full((2, len(hosts.members)), np.nan)  # not reported by the SDK
    if index is not None:
        return nanmed(m[[CPUW, CPUT]][:, index], -1)
    return np.array(
        [[med(m[CPUW][idx]) for idx in hosts.members], [med(m[CPUT][idx]) for idx in hosts.members]]
    )


def _components(cs: ClosedStep) -> np.ndarray:
    m = cs.med
    if not cs.has_phases or np.isnan(m[BUSY]):
        return np.array([m[DUR] - m[PAUSE], *[np.nan] * (len(COMPONENTS) - 1)])
    collective = nmin(cs.comm)
    if collective != collective and not np.isnan(m[BWD]):
        return _ddp_components(cs)
    collective = 0.0 if collective != collective else collective
    other = _least_other(cs)
    step = m[BUSY] + collective + other
    return np.array([step, m[BUSY], m[DATA], m[COMPUTE], m[XFER], collective, other])


def _least_other(cs: ClosedStep) -> float:
    """Unexplained time of the rank with the least: a late rank's tail (its optimizer, an
    untimed section) shows as every *other* rank's unexplained time, not its own."""
    v = nmin(cs.m[OTHER])
    return 0.0 if v != v else v


def _ddp_components(cs: ClosedStep) -> np.ndarray:
    """No comm_wait measured: the peers' wait for the slowest rank sits in their backward
    (DDP), so the backward of the rank that waited least (the shortest) stands for the
    backward compute plus the collective's own tail; the other phases are medians."""
    m = cs.med
    compute = _wait_free_compute(m, nmin(cs.m[BWD]))
    data = 0.0 if np.isnan(m[DATA]) else m[DATA]
    xfer = 0.0 if np.isnan(m[XFER]) else m[XFER]
    busy = data + compute + xfer
    other = _least_other(cs)
    return np.array([busy + other, busy, m[DATA], compute, m[XFER], 0.0, other])


def _wait_free_compute(m: np.ndarray, bwd: float) -> float:
    parts = np.array([m[FWD], bwd, m[OPT], m[EXTRA]])
    return float(np.nansum(parts))


def _group_medians(cs: ClosedStep, busy: np.ndarray, groups: GroupIndex) -> np.ndarray:
    ddp = cs.has_phases and np.isnan(cs.comm).all() and not np.isnan(cs.med[BWD])
    if len(groups.members) == 1:
        if ddp:
            return np.array([_components(cs)[1]])
        return np.array([cs.med[BUSY] if cs.has_phases else med(busy)])
    if ddp:  # per group: busy without backward (medians) + the group's shortest backward
        nobwd = busy - np.where(np.isnan(cs.m[BWD]), 0.0, cs.m[BWD])
        return np.array([med(nobwd[idx]) + nmin(cs.m[BWD][idx]) for idx in groups.members])
    return np.array([med(busy[idx]) for idx in groups.members])


def trailing_run(x: np.ndarray, level: float, gap: int = 1) -> int:
    """Steps before the last one that the trailing run of values above ``level`` began;
    up to ``gap`` consecutive values at or below it (or NaN) do not end the run."""
    start, below = len(x) - 1, 0
    for i in range(len(x) - 1, -1, -1):
        if x[i] > level:
            start, below = i, 0
        else:
            below += 1
            if below > gap:
                break
    return len(x) - 1 - start
