"""Straggler scores: each rank against its peer group, with robust statistics and persistence.

Synchronous training equalises total step time, so the score is built from the
*busy* time of each rank (data + forward + backward + optimizer + other named
sections: everything but the exposed collective wait and checkpointing). The
straggler is the rank with the most busy time and the least ``comm_wait``.

Per step and peer group: ``excess_i = busy_i / median(busy) - 1``; the group's
spread is ``1.4826 * MAD(excess)``; a rank is *flagged* in a step when its
excess is above ``max(min_excess, z * typical spread)`` (and, when comm_wait is
measured, it waits no more than the group median). A rank becomes a
*candidate* when flagged in ``k`` of the last ``n`` steps and its median excess
over those ``n`` steps is above the threshold too: single slow steps and
whole-job pauses (which hit every rank) never qualify.

Without phases, the fallback basis is the timestamps: how much later a rank's
step ends, or how much longer it lasts, than its peers' (relative to the median
step time). Synchronous training often hides a straggler from timestamps
alone; the evidence says which basis was used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streams.core.assembly import ClosedStep
from streams.core.config import DetectConfig
from streams.core.ranks import GroupIndex
from streams.core.ring import Ring

MAD_SIGMA = 1.4826
NOISE_STEPS = 64


@dataclass(frozen=True, slots=True)
class Candidate:
    rank: int
    score: float  # median relative excess over the window (0.10 = 10 % more busy time)
    flagged: int  # steps flagged in the window
    threshold: float


class StragglerTracker:
    """Windows of per-rank excess for one job (fixed world size)."""

    def __init__(self, world_size: int, cfg: DetectConfig) -> None:
        self.cfg = cfg
        self.world_size = world_size
        n = cfg.window_steps
        self.excess = Ring(n, world_size)
        self.flags = Ring(n, world_size, fill=0, dtype=np.int8)
        self.count = np.zeros(world_size, dtype=np.int16)
        self.busy = Ring(n, world_size)
        self.data = Ring(n, world_size)
        self.compute = Ring(n, world_size)
        self.xfer = Ring(n, world_size)
        self.comm = Ring(n, world_size)
        self.threshold = np.full(world_size, cfg.straggler_min_excess)
        self.basis = "phases"
        self._noise: dict[int, Ring] = {}
        self._groups_version = -1

    def reset(self) -> None:
        for ring in (self.excess, self.flags, self.busy, self.data, self.compute, self.xfer,
                     self.comm):
            ring.clear()
        self.count[:] = 0

    def update(self, cs: ClosedStep, groups: GroupIndex) -> None:
        """Score one closed step."""
        if groups.version != self._groups_version:
            self._noise.clear()
            self._groups_version = groups.version
        busy, basis = self._metric(cs)
        self.basis = basis
        excess = np.full(self.world_size, np.nan)
        flagged = np.zeros(self.world_size, dtype=np.int8)
        for g, idx in enumerate(groups.members):
            if len(idx) < self.cfg.min_group_size:
                continue
            self._score_group(g, idx, busy, cs.comm, excess, flagged)
        old = self.flags.push(flagged)
        self.count += flagged
        self.count -= old
        self.excess.push(excess)
        self.busy.push(busy)
        self.data.push(cs.data)
        self.compute.push(cs.compute)
        self.xfer.push(cs.xfer)
        self.comm.push(cs.comm)

    def _metric(self, cs: ClosedStep) -> tuple[np.ndarray, str]:
        if cs.has_phases and not np.isnan(cs.compute[cs.present]).all():
            return cs.compute + np.nan_to_num(cs.data) + np.nan_to_num(cs.xfer), "phases"
        med_dur = np.nanmedian(cs.dur)
        late_end = cs.end - np.nanmedian(cs.end)
        long_dur = cs.dur - med_dur
        # expressed as a busy-like time so that excess = lateness / median step time
        return med_dur + np.fmax(late_end, long_dur), "timestamps"

    def _score_group(
        self,
        g: int,
        idx: np.ndarray,
        busy: np.ndarray,
        comm: np.ndarray,
        excess: np.ndarray,
        flagged: np.ndarray,
    ) -> None:
        x = busy[idx]
        ok = ~np.isnan(x)
        if ok.sum() < self.cfg.min_group_size:
            return
        med = float(np.median(x[ok]))
        if med <= 0:
            return
        e = x / med - 1.0
        spread = MAD_SIGMA * float(np.median(np.abs(e[ok] - np.median(e[ok]))))
        noise = self._noise.get(g)
        if noise is None:
            noise = self._noise[g] = Ring(NOISE_STEPS, 1)
        noise.push(spread)
        typical = float(np.median(noise.filled()))
        thr = max(self.cfg.straggler_min_excess, self.cfg.straggler_z * typical)
        hit = e > thr
        if self.cfg.require_comm_corroboration:
            c = comm[idx]
            cok = ~np.isnan(c)
            if cok.sum() >= self.cfg.min_group_size:
                hit &= ~(c > np.median(c[cok]))  # NaN comm does not veto
        excess[idx] = e
        flagged[idx] = hit
        self.threshold[idx] = thr

    def candidates(self) -> list[Candidate]:
        """Ranks whose flags persisted (k of n) and whose median excess is above threshold."""
        k = self.cfg.persist_steps
        out = []
        for rank in np.flatnonzero(self.count >= k).tolist():
            score = self.score(rank)
            thr = float(self.threshold[rank])
            if score > thr:
                out.append(Candidate(rank, score, int(self.count[rank]), thr))
        return out

    def score(self, rank: int) -> float:
        col = self.excess.filled()[:, rank]
        col = col[~np.isnan(col)]
        return float(np.median(col)) if len(col) else float("nan")

    def still_slow(self, rank: int) -> tuple[bool, float]:
        """Whether an open straggler still holds (hysteresis), and its current score."""
        score = self.score(rank)
        thr = float(self.threshold[rank]) * self.cfg.straggler_clear_ratio
        return bool(score > thr), score

    def suspicious(self) -> bool:
        """Any rank flagged in more than one step of the window (suppresses job_slowdown)."""
        return bool((self.count >= max(2, self.cfg.persist_steps - 2)).any())

    def evidence(self, rank: int, members: np.ndarray) -> dict[str, float | int | str | None]:
        """The numbers behind a rank's score: its medians against its group's, in seconds."""
        out: dict[str, float | int | str | None] = {
            "basis": self.basis,
            "flagged_steps": int(self.count[rank]),
            "window_steps": self.cfg.window_steps,
            "threshold": round(float(self.threshold[rank]), 4),
            "group_size": len(members),
        }
        for name, ring in (("busy", self.busy), ("data", self.data), ("compute", self.compute),
                           ("transfer", self.xfer), ("comm_wait", self.comm)):
            rows = ring.filled()
            own = _nanmedian(rows[:, rank])
            peers = _nanmedian(np.nanmedian(rows[:, members], axis=1)) if len(rows) else None
            out[f"{name}_s"] = _round(own)
            out[f"{name}_peer_median_s"] = _round(peers)
        peer_medians = [_nanmedian(self.busy.filled()[:, r]) for r in members.tolist()]
        valid = [m for m in peer_medians if m is not None and m > 0]
        own = _nanmedian(self.busy.filled()[:, rank])
        if valid and own:
            out["nvrx_relative"] = round(min(valid) / own, 4)  # min-of-medians / own median
        return out


def _nanmedian(x: np.ndarray) -> float | None:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
