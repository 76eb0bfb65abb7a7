"""A host that is half of its job: each host's work against its own history.

Peer comparison needs a majority of healthy peers. In a job of two hosts, a
slow host is half of every peer group: it moves the group median half way to
itself, and the group's spread swells with the split, so neither half stands
out. Each host's own history still does: the host's busy time per step (the
lower median over its ranks: it grows only when most of them slow) is compared
with its own baseline, the median of earlier steps on which that host was not
flagged, exactly as the job's own history is (:mod:`stepwatch.streams.core.slowdown`).

A host is *slow* when it was flagged in ``slowdown_persist_steps`` of the last
``window_steps`` steps, its median ratio over them is above its threshold
(``max(slowdown_min_excess, slowdown_z x its own spread)``), the extra
seconds cost the step at least ``straggler_material_share`` of its time, and
every other host is calm (median ratio at most half its threshold): the
others only wait for it. A whole-job slowdown moves every host and stays a
``job_slowdown``. Only jobs of 2 to ``host_history_max_hosts`` hosts are
tracked: with more, a slow host is a minority of its peers and the peer
comparison finds it. Only jobs whose every peer group spans several hosts:
where a host is a whole group (a pipeline stage) its ranks also wait for the
other stages inside their phases, and the group slowdown names it. And not
while a straggler incident or suspect on another host explains the job's
extra time (its peers wait for it inside their phases, under FSDP, say).

Under DDP without ``comm_wait`` the peers' wait sits in their backward, so the
host metric leaves backward out (data, forward, optimizer and other sections).
The cause is read from what grew against the host's own baseline: the data
phase, the compute phases, or the CPU run-queue wait beyond what its CPU time
would cost at its own earlier waiting share (the peers' medians moved with the
split and say little).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepwatch.streams.core.assembly import BWD, COMM, COMPUTE, CPUT, CPUW, DATA, XFER, ClosedStep
from stepwatch.streams.core.causes import Evidence, Shares, extra_wait
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostsplit import HostSplit
from stepwatch.streams.core.ranks import GroupIndex
from stepwatch.streams.core.ring import Ring
from stepwatch.streams.core.stats import MAD_SIGMA, change_point, nanlowmed, nanmed

REBASE_STEPS = 4
# what each host's row holds: its metric, then the parts its cause is read from
METRIC, H_DATA, H_COMPUTE, H_XFER, H_CPUW, H_CPUT, H_COMM = range(7)
PARTS = 7


@dataclass(frozen=True, slots=True)
class SlowHost:
    host: str
    score: float  # median ratio to its own baseline over the window - 1
    threshold: float
    baseline_s: float  # the host's busy time per step (lower median over its ranks), before
    current_s: float  # ... and now
    onset_back: int  # steps before the last one the host's slowdown began
    shares: Shares  # where the extra time sits, against the host's own baseline
    # "own": against its own history; "peers": against the other hosts now (see split_host)
    basis: str = "own"


class HostHistory:
    """Each host's busy time against its own baseline (jobs of a few hosts only)."""

    def __init__(self, cfg: DetectConfig) -> None:
        self.cfg = cfg
        self.names: tuple[str, ...] = ()
        self._version = (-1, -1)
        self.shared = False
        self._index: np.ndarray | None = None
        self.history: Ring | None = None  # host metric on steps the host was not flagged
        self.recent: Ring | None = None
        self.ratios: Ring | None = None
        self.flags: Ring | None = None
        self.base: np.ndarray | None = None
        self.threshold: np.ndarray | None = None
        self.split: HostSplit | None = None
        self._stale = 0

    def on_restart(self) -> None:
        """A new run: the window belongs to the old one (the hosts' baselines are kept)."""
        for ring in (self.recent, self.ratios, self.flags):
            if ring is not None:
                ring.clear()
        if self.split is not None:
            self.split.on_restart()

    def update(
        self, cs: ClosedStep, busy: np.ndarray, hosts: GroupIndex, groups: GroupIndex
    ) -> None:
        n = len(hosts.names)
        if not 2 <= n <= self.cfg.host_history_max_hosts or not cs.has_phases:
            return
        if (hosts.version, groups.version) != self._version:
            self._reset(hosts, groups)
        if not self.shared:
            return  # a host is a whole peer group (a pipeline stage): a group slowdown
        assert self.history is not None and self.recent is not None
        assert self.ratios is not None and self.flags is not None
        x_rank, compute = _rank_metric(cs, busy)
        metric = _medians(x_rank[None], hosts, self._index)[0]
        if self.base is not None and self.threshold is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = metric / self.base[METRIC] - 1.0
            flagged = ratio > self.threshold
        else:
            ratio = np.full(n, np.nan)
            flagged = np.zeros(n, dtype=bool)
        # the parts a cause is read from cost a median each: every few steps for the
        # baseline, every step only while a host is (or was lately) flagged
        split = self.split
        if split is not None:
            split.push(metric)
        watch = (
            bool(flagged.any())
            or bool(self.flags.filled().any())
            or (split is not None and split.watching())
        )
        x = np.full((PARTS, n), np.nan)
        x[METRIC] = metric
        if watch or self._stale == REBASE_STEPS - 1:
            x[METRIC + 1 :] = _host_parts(cs, compute, hosts, self._index)
        self.recent.push(x)
        self.ratios.push(ratio)
        self.flags.push(flagged.astype(float))
        self.history.push(np.where(flagged, np.nan, x))
        self._stale += 1
        if self._stale >= REBASE_STEPS:
            self._rebase()

    def _reset(self, hosts: GroupIndex, groups: GroupIndex) -> None:
        n, cfg = len(hosts.names), self.cfg
        self.names, self._version = hosts.names, (hosts.version, groups.version)
        # every peer group spans several hosts: each host has peers off it to wait for it
        self.shared = all(len(set(hosts.of_rank[idx].tolist())) >= 2 for idx in groups.members)
        # hosts of equal size (the rule): one (hosts, ranks) index, one gather per row set
        same = len({len(idx) for idx in hosts.members}) == 1
        self._index = np.stack(hosts.members) if same else None
        self.history = Ring(cfg.baseline_steps, (PARTS, n))
        self.recent = Ring(cfg.window_steps, (PARTS, n))
        self.ratios = Ring(cfg.window_steps, n)
        self.flags = Ring(cfg.window_steps, n, fill=0)
        self.split = HostSplit(cfg, n) if cfg.host_split else None
        self.base = self.threshold = None
        self._stale = 0

    def _rebase(self) -> None:
        self._stale = 0
        assert self.history is not None
        if self.split is not None:
            self.split.rebase()
        hist = self.history.filled()
        metric = hist[:, METRIC]
        if (~np.isnan(metric)).sum(0).min() < self.cfg.min_baseline_steps:
            return
        base = nanmed(hist, 0)  # (PARTS, hosts)
        if not (base[METRIC] > 0).all():
            return
        spread = MAD_SIGMA * nanmed(np.abs(metric - base[METRIC]), 0) / base[METRIC]
        self.base = base
        self.threshold = np.maximum(self.cfg.slowdown_min_excess, self.cfg.slowdown_z * spread)

    def slow_host(self, step_s: float) -> SlowHost | None:
        """The one host that slowed against its own history while the others stayed calm,
        when its extra time costs ``step_s`` (the job's step time) a material share."""
        if self.threshold is None or self.ratios is None or self.flags is None:
            return None
        count = self.flags.filled().sum(0)
        if not count.max() >= self.cfg.slowdown_persist_steps:
            return None  # the common case: no host flagged often enough
        score = nanmed(self.ratios.filled(), 0)
        slow = np.flatnonzero((count >= self.cfg.slowdown_persist_steps) & (score > self.threshold))
        calm = score <= self.threshold / 2
        if len(slow) != 1 or int(calm.sum()) != len(score) - 1:
            return None
        found = self._about(int(slow[0]), score)
        extra = found.current_s - found.baseline_s
        if not step_s > 0 or extra / step_s < self.cfg.straggler_material_share:
            return None
        return found

    def split_host(self, step_s: float) -> SlowHost | None:
        """The one host slower than the job's other hosts *now* (see :class:`HostSplit`),
        when its extra time costs ``step_s`` a material share: a host that was slow before
        its own baseline formed, which its own history cannot show."""
        if self.split is None or self.recent is None:
            return None
        g = self.split.slow_one()
        if g is None:
            return None
        found = self._against_peers(g)
        if found is None:
            return None
        extra = found.current_s - found.baseline_s
        if not step_s > 0 or extra / step_s < self.cfg.straggler_material_share:
            return None
        return found

    def still_slow(self, host: str, basis: str = "own") -> SlowHost | None:
        """``host`` while its ratio (to its own baseline, or to the other hosts for
        ``basis`` "peers") stays above the clear ratio of its threshold."""
        if host not in self.names:
            return None
        g = self.names.index(host)
        if basis == "peers":
            holds = self.split is not None and self.split.holds(g)
            return self._against_peers(g) if holds else None
        if self.threshold is None or self.ratios is None:
            return None
        score = nanmed(self.ratios.filled(), 0)
        if not score[g] > self.threshold[g] * self.cfg.straggler_clear_ratio:
            return None
        return self._about(g, score)

    def _against_peers(self, g: int) -> SlowHost | None:
        """Host ``g`` against the other hosts over the window since its split began: None
        unless its ranks wait less in collectives than the others' (the job waits for it)."""
        assert self.split is not None and self.recent is not None
        score, threshold, back = self.split.about(g)
        recent = self.recent.last(min(self.recent.count, back + 1))
        now = nanmed(recent[:, :, g], 0)
        others = nanmed(nanlowmed(np.delete(recent, g, axis=2)), 0)
        if not now[H_COMM] < others[H_COMM]:
            return None  # comm_wait not measured (NaN), or the host waits as long
        return SlowHost(
            self.names[g],
            score,
            threshold,
            float(others[METRIC]),
            float(now[METRIC]),
            back,
            _shares(others, now),
            "peers",
        )

    def _about(self, g: int, score: np.ndarray) -> SlowHost:
        assert self.base is not None and self.threshold is not None
        assert self.recent is not None and self.ratios is not None
        ratios = self.ratios.last(self.ratios.count)[:, g]
        back = len(ratios) - 1 - change_point(ratios) if len(ratios) else 0
        recent = self.recent.last(min(self.recent.count, back + 1))[:, :, g]
        now = nanmed(recent, 0)  # (PARTS,): the host since its onset
        base = self.base[:, g]
        return SlowHost(
            self.names[g],
            float(score[g]),
            float(self.threshold[g]),
            float(base[METRIC]),
            float(now[METRIC]),
            back,
            _shares(base, now),
        )


def _shares(base: np.ndarray, now: np.ndarray) -> Shares:
    """Shares of the host's extra time (against its own baseline) in the data phase, the
    compute phases and CPU run-queue wait beyond its baseline waiting share."""
    grew = float(now[METRIC] - base[METRIC])
    if not grew > 0:
        return Shares()

    def share(i: int) -> float | None:
        d = float(now[i] - base[i])
        return None if d != d else max(0.0, min(1.0, d / grew))

    extra = extra_wait(
        float(now[H_CPUW]), float(now[H_CPUT]), float(base[H_CPUW]), float(base[H_CPUT])
    )
    cpu = None if extra != extra else max(0.0, min(1.0, extra / grew))
    ev: Evidence = {} if cpu is None else {"cpu_wait_excess_s": round(extra, 6)}
    return Shares(share(H_DATA), share(H_COMPUTE), cpu, ev)


def _rank_metric(cs: ClosedStep, busy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's busy time and compute time, backward left out under DDP without
    ``comm_wait`` (it holds the wait for the slowest rank)."""
    m = cs.m
    if np.isnan(cs.comm).all() and not np.isnan(cs.med[BWD]):
        bwd = np.where(np.isnan(m[BWD]), 0.0, m[BWD])
        return busy - bwd, m[COMPUTE] - bwd
    return busy, m[COMPUTE]


def _host_parts(
    cs: ClosedStep, compute: np.ndarray, hosts: GroupIndex, index: np.ndarray | None
) -> np.ndarray:
    """(PARTS - 1, hosts): each host's medians of data, compute, transfers, CPU wait, CPU
    time and collective wait, in the order of H_DATA..H_COMM."""
    m = cs.m
    rows = np.stack([m[DATA], compute, m[XFER], m[CPUW], m[CPUT], m[COMM]])
    return _medians(rows, hosts, index)


def _medians(rows: np.ndarray, hosts: GroupIndex, index: np.ndarray | None) -> np.ndarray:
    """(rows, hosts): the lower median of each row over each host's ranks: it grows only
    when most of the host's ranks do (one slow rank of a host of two moves a plain median,
    their mean, half way; that rank is a straggler against its peers, not a slow host)."""
    if index is not None:
        return nanlowmed(rows[:, index])
    return np.stack([nanlowmed(rows[:, idx]) for idx in hosts.members], axis=1)
