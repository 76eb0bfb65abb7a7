"""A robust one-sided CUSUM per rank and dimension: the straggler's incident gate.

Per step, for every rank and dimension (busy time, each phase), the excess over
the group's median ``e`` (in units of the median busy time) is standardised and
clipped::

    z = clip((e - kappa) / scale, -clip, clip)
    S = max(0, S + z)

``kappa`` is the smallest excess worth an incident (the material share
converted into busy-time units): the statistic drifts down while the rank's
excess stays below it, and climbs only while the rank costs the step more.
``scale`` is the larger of the group's typical spread and the rank's *own*
spread (1.25 x an exponentially weighted mean absolute excess, updated only on
unflagged steps): a rank whose speed wanders (slow per-rank drift, ragged
batches) needs proportionally more evidence. Clipping bounds what one
heavy-tailed step can add (at most ``clip``), so at least ``ceil(h / clip)``
steps far above the reference are needed, and a run of ordinary steps pulls
``S`` back to 0. The alarm is ``S >= h``.

False alarms: for independent increments with a negative mean, the chance that
one excursion of ``S`` from 0 reaches ``h`` is at most ``exp(-theta h)``, where
``theta > 0`` solves ``E[exp(theta z)] = 1`` (Wald). The rate under
heavy-tailed, autocorrelated noise is measured by
``tests/unit/streams/core/test_tiers.py`` and given in docs/detection.md.
"""

from __future__ import annotations

import math

import numpy as np

OWN_ALPHA = 1.0 / 32  # weight of a new step in the rank's own mean absolute excess
ABS_TO_SIGMA = 1.2533  # mean absolute deviation x this estimates sigma (normal data)


class RobustCusum:
    """The CUSUM of every (dimension, rank) of one job, with each rank's own spread."""

    def __init__(self, shape: tuple[int, int], h: float, clip: float) -> None:
        self.h = h
        self.clip = clip
        self.s = np.zeros(shape)
        self.own = np.full(shape, np.nan)  # mean absolute excess on unflagged steps
        # the anchor: the last step (and its end time) at which S was 0, or at its lowest
        # since it last fell by h from a peak: the change began after it (the CUSUM's own
        # change-point estimate; see ``_anchor``)
        self.anchor_step = np.full(shape, -1, dtype=np.int64)
        self.anchor_ts = np.full(shape, np.nan)
        self.low = np.zeros(shape)  # S at the anchor
        self.peak = np.zeros(shape)  # the largest S since the anchor

    def reset(self) -> None:
        self.s[:] = 0.0
        self.own[:] = np.nan
        self.anchor_step[:] = -1
        self.anchor_ts[:] = np.nan
        self.low[:] = 0.0
        self.peak[:] = 0.0

    def forget(self, ranks: np.ndarray) -> None:
        """Start ``ranks`` afresh (as at the job's start)."""
        self.s[:, ranks] = 0.0
        self.own[:, ranks] = np.nan
        self.anchor_step[:, ranks] = -1
        self.anchor_ts[:, ranks] = np.nan
        self.low[:, ranks] = 0.0
        self.peak[:, ranks] = 0.0

    def update(
        self,
        e: np.ndarray,
        spread: np.ndarray,
        kappa: float,
        flagged: np.ndarray,
        excluded: np.ndarray,
        step: int = 0,
        ts: float = 0.0,
    ) -> None:
        """``e`` and ``spread`` (dims, ranks); ``flagged`` (ranks,) leaves the own spread
        alone; ``excluded`` (dims, ranks) dimensions that are no evidence (DDP backward).
        A NaN excess (absent rank, unmeasured phase) sets S back to 0."""
        scale = np.fmax(spread, ABS_TO_SIGMA * self.own)  # NaN own spread: the group's
        scale[excluded] = np.inf  # z = 0: S stays 0
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (e - kappa) / scale
        np.clip(z, -self.clip, self.clip, out=z)
        self.s = np.fmax(self.s + z, 0.0)  # fmax: NaN -> 0
        self._anchor(step, ts)
        a = np.abs(e)
        calm = (flagged == 0)[None, :] & ~np.isnan(a)
        new = self.own + OWN_ALPHA * (a - self.own)
        np.copyto(new, a, where=np.isnan(self.own))
        np.copyto(self.own, new, where=calm)

    def _anchor(self, step: int, ts: float) -> None:
        """Move the change-point estimate to this step where S is 0, at or under its S at
        the anchor, or an alarm's worth (h) under its peak since the anchor. The last: a
        burst that raised S and the calm steps after it that took it most of the way
        back did not reach 0, and the last 0 lay before the burst, not at a later fault
        (a fall of h is as much evidence that the change ended as a rise of h is that
        it began)."""
        at = (self.s <= self.low) | (self.peak - self.s >= self.h)
        np.copyto(self.anchor_step, step, where=at)
        np.copyto(self.anchor_ts, ts, where=at)
        np.copyto(self.low, self.s, where=at)
        np.copyto(self.peak, self.s, where=at)
        np.fmax(self.peak, self.s, out=self.peak)

    @property
    def min_run(self) -> int:
        """The fewest steps a change needs to take S from 0 to the alarm (each adds at
        most ``clip``)."""
        return max(1, math.ceil(self.h / self.clip))

    def alarm(self, rank: int) -> bool:
        return bool(self.s[:, rank].max() >= self.h)

    def level(self, rank: int) -> float:
        return float(self.s[:, rank].max())

    def onset(self, ranks: list[int]) -> tuple[int, float] | None:
        """The estimated first step of the change on ``ranks`` (the earliest among them,
        in each rank's dimension of largest S) and the event time it began; None when
        no rank's S is above 0."""
        best: tuple[int, float] | None = None
        for r in ranks:
            d = int(np.argmax(self.s[:, r]))
            if self.s[d, r] <= 0 or self.anchor_step[d, r] < 0:
                continue
            cand = (int(self.anchor_step[d, r]) + 1, float(self.anchor_ts[d, r]))
            if best is None or cand[0] < best[0]:
                best = cand
        return best
