"""A host slower than the job's other hosts *now*: half of a job, slow from its start.

:mod:`stepwatch.streams.core.hosthistory` finds a host that is half of its job
against the host's own history. A host that was slow before that history
formed (another process settled on its cores as the job started, a host with
slower memory) has no earlier self to stand out against, and in a job of two
hosts its peers' median sits half way between the halves: neither check sees
it. The other hosts of the same job do, step by step.

Each step, each host's metric (the lower median of its ranks' busy time, as in
``hosthistory``) is divided by the lower median of the other hosts' metrics:
``q = metric / others - 1``. A host is **split off** when, over the last
``window_steps`` steps, ``q`` was above its threshold on at least
``slowdown_persist_steps`` of them and its median is above it, and every other
host's median ``q`` is at most 0. The threshold is
``max(slowdown_min_excess, slowdown_z x 1.25 sigma / sqrt(window_steps))``:
five standard errors of a window median, with ``sigma`` the spread of ``q``
over the host's history (its MAD around its median, so that a split present
from the start is an offset, not spread). :class:`HostHistory` adds the rest:
the host's ranks must wait less in collectives than the other hosts' (the job
waits for them), and the extra time must cost the step a material share.
"""

from __future__ import annotations

import math

import numpy as np

from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.ring import Ring
from stepwatch.streams.core.stats import MAD_SIGMA, change_point, nanlowmed, nanmed


class HostSplit:
    """Each host's busy time over the other hosts', for one job of ``n`` hosts."""

    def __init__(self, cfg: DetectConfig, n: int) -> None:
        self.cfg = cfg
        self.n = n
        self.history = Ring(cfg.baseline_steps, n)  # q of every step, for its spread
        self.window = Ring(cfg.window_steps, n)
        self.flags = Ring(cfg.window_steps, n, fill=0)
        self.threshold: np.ndarray | None = None
        # for each host, the other hosts' indices (n is small: at most host_history_max_hosts)
        self._others = np.array([[h for h in range(n) if h != g] for g in range(n)], np.intp)

    def on_restart(self) -> None:
        """A new run: the window belongs to the old one (the spread is kept)."""
        self.window.clear()
        self.flags.clear()

    def push(self, metric: np.ndarray) -> None:
        """One step's host metrics (NaN: the host did not report)."""
        others = nanlowmed(metric[self._others])
        with np.errstate(divide="ignore", invalid="ignore"):
            q = metric / others - 1.0
        self.history.push(q)
        self.window.push(q)
        if self.threshold is None:
            self.flags.push(0.0)
        else:
            with np.errstate(invalid="ignore"):
                self.flags.push((q > self.threshold).astype(float))

    def rebase(self) -> None:
        """Each host's threshold from the spread of its ``q`` over the history."""
        hist = self.history.filled()
        if (~np.isnan(hist)).sum(0).min() < self.cfg.min_baseline_steps:
            return
        sigma = MAD_SIGMA * nanmed(np.abs(hist - nanmed(hist, 0)), 0)
        se = 1.25 * sigma / math.sqrt(self.cfg.window_steps)
        self.threshold = np.maximum(self.cfg.slowdown_min_excess, self.cfg.slowdown_z * se)

    def watching(self) -> bool:
        """Some host was over its threshold lately (its parts are worth reading)."""
        return bool(self.flags.filled().any())

    def slow_one(self) -> int | None:
        """The index of the one host split off, or None."""
        if self.threshold is None:
            return None
        count = self.flags.filled().sum(0)
        k = self.cfg.slowdown_persist_steps
        if not count.max() >= k:
            return None  # the common case
        score = nanmed(self.window.filled(), 0)
        slow = np.flatnonzero((count >= k) & (score > self.threshold))
        if len(slow) != 1:
            return None
        g = int(slow[0])
        rest = np.delete(score, g)
        return g if bool((rest <= 0).all()) else None

    def holds(self, g: int) -> bool:
        """Host ``g`` still over the clear ratio of its threshold (an open incident)."""
        if self.threshold is None:
            return False
        score = float(nanmed(self.window.filled()[:, g], 0))
        return bool(score > self.threshold[g] * self.cfg.straggler_clear_ratio)

    def about(self, g: int) -> tuple[float, float, int]:
        """(median q over the window, threshold, steps before the last one it began)."""
        assert self.threshold is not None
        q = self.window.last(self.window.count)[:, g]
        back = len(q) - 1 - change_point(q) if len(q) else 0
        return float(nanmed(q, 0)), float(self.threshold[g]), back
