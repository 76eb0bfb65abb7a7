"""Straggler scores: each rank against its peer group, with robust statistics and persistence.

Synchronous training equalises total step time, so the score is built from the
*busy* time of each rank (data + forward + backward + optimizer + other named
sections: everything but the exposed collective wait and checkpointing). The
straggler is the rank with the most busy time and the least ``comm_wait``.

Per step and peer group: ``excess_i = busy_i / median(busy) - 1`` and the
group's spread ``sigma = 1.4826 * MAD(excess)`` (its median over the last 64
steps is the typical spread). A rank is *flagged* in a step when its excess is
above ``max(min_excess, step_z * sigma)`` and, when comm_wait is measured, it
waits no more than the group median. Its *score* is the median excess over the
last ``n`` steps. It becomes a *candidate* when flagged in ``k`` of the last
``n`` steps and its score is above ``max(min_excess, z * 1.25 * sigma / sqrt(n))``
(the noise of a median of ``n`` steps): single slow steps and whole-job pauses
(which hit every rank) never qualify. Persistence is also counted in event time
(:meth:`StragglerTracker.lasted`): a new incident's run of flags must have begun
at least ``straggler_min_seconds`` before (a 1 s burst of a neighbour's CPU
load, 15 steps of a 60 ms job, is not an incident; with steps of half a second
or more, ``k`` steps already span it).

Phases are compared one by one as well (data, forward, backward, optimizer,
other named sections, own transfers): ``excess_p = (x_p - median(x_p)) /
median(busy)``, i.e. in the same unit as the busy excess, with its own typical
spread per group and phase. Under PyTorch DDP the peers' wait for a slow rank
is *inside their backward*, so every rank's busy time is equal while the slow
rank's forward is the longest (and its backward the shortest): the per-phase
excess finds it where the sum cannot. A rank is flagged in a step when its
busy excess *or* one phase's excess passes that dimension's limit; its score
is the largest window median among the dimensions over their thresholds.

Without phases, the fallback basis is the timestamps: how much later a rank's
step ends, or how much longer it lasts, than its peers' (relative to the median
step time). Synchronous training often hides a straggler from timestamps
alone; the evidence says which basis was used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepwatch.streams.core.assembly import (
    BUSY,
    COMM,
    COMPUTE,
    CPUT,
    CPUW,
    DATA,
    DUR,
    PAUSE,
    PHASE_NAMES,
    PHASE_ROWS,
    ROWS,
    START,
    XFER,
    ClosedStep,
)
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.cusum import RobustCusum
from stepwatch.streams.core.ranks import GroupIndex
from stepwatch.streams.core.ring import Ring
from stepwatch.streams.core.stats import (
    MAD_SIGMA,
    change_point,
    colmed,
    med,
    median_change_point,
    nanlowmed,
    nanmed,
    opt,
    rowmed,
)

Evidence = dict[str, str | float | int | bool | None]

NOISE_STEPS = 64
# the window's median split is kept when its jump is this many standard errors
# (StragglerTracker._window_split)
ONSET_Z = 3.0
# the way a rank is slow (see StragglerScores.way): the kind of work its phases do
_WAY_OF_PHASE = {
    "data": "input",
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "other": "compute",
    "transfer": "transfer",
}
_EVIDENCE_NAMES = (
    "busy",
    "data",
    "compute",
    "transfer",
    "comm_wait",
    "cpu_wait",
    "cpu_time",
    *[p for p in PHASE_NAMES if p not in ("data", "transfer")],
)
_EVIDENCE_ROWS = [
    BUSY,
    DATA,
    COMPUTE,
    XFER,
    COMM,
    CPUW,
    CPUT,
    *[r for r, p in zip(PHASE_ROWS, PHASE_NAMES, strict=True) if p not in ("data", "transfer")],
]
DIM_NAMES = ("busy", *PHASE_NAMES)  # dimension 0: the sum; then the phases one by one
DIM_ROWS = [BUSY, *PHASE_ROWS]
NDIM = len(DIM_ROWS)
_BWD_DIM = DIM_NAMES.index("backward")


@dataclass(frozen=True, slots=True)
class Candidate:
    rank: int
    score: float  # median relative excess over the window (0.10 = 10 % more busy time)
    flagged: int  # steps flagged in the window
    threshold: float
    cost: float  # what the excess costs the step: its share of the median step time
    cusum: float  # the rank's robust CUSUM (largest over dimensions): see cusum.py


class StragglerTracker:
    """Windows of per-rank excess (busy and each phase) for one job (fixed world size)."""

    def __init__(self, world_size: int, cfg: DetectConfig) -> None:
        self.cfg = cfg
        self.world_size = world_size
        n = cfg.window_steps
        self.excess = Ring(n, (NDIM, world_size))
        self.flags = Ring(n, world_size, fill=0, dtype=np.int8)
        self.count = np.zeros(world_size, dtype=np.int16)
        # event time of the first flag of each rank's current run of flags (NaN: none)
        self.since = np.full(world_size, np.nan)
        self.since_step = np.zeros(world_size, dtype=np.int64)  # ... and its step
        self.now = 0.0
        self.step = -1  # the last step scored
        self.steps = Ring(n, (ROWS, world_size))  # the window's ClosedStep rows
        self.threshold = np.full((NDIM, world_size), cfg.straggler_min_excess)
        self.basis = "phases"
        self._noise: dict[int, Ring] = {}
        self._sigma: dict[int, np.ndarray] = {}
        self._groups_version = -1
        self._sqrt_n = float(np.sqrt(cfg.window_steps))
        self._bnoise: Ring | None = None
        self._bsigma: np.ndarray | None = None
        self._floor2 = np.full(
            (NDIM, 1), cfg.straggler_min_excess * cfg.straggler_phase_floor_ratio
        )
        self._floor2[0] = cfg.straggler_min_excess
        self._thr_scale = cfg.straggler_z * 1.25 / float(np.sqrt(cfg.window_steps))
        self._batch_version = -1
        self._batch: tuple[np.ndarray, int, int] | None = None
        self._floor = np.full(NDIM, cfg.straggler_min_excess * cfg.straggler_phase_floor_ratio)
        self._floor[0] = cfg.straggler_min_excess
        self._score_cache: dict[int, np.ndarray] = {}  # rank -> _scores(rank) of this step
        # median busy time over median step time (pauses left out), per step: converts an
        # excess in units of busy time into its cost as a share of the step
        self._busy_share = Ring(n, 1)
        self._ratio = float("nan")  # the window's median of _busy_share (this step)
        self.spread = np.full((NDIM, world_size), np.nan)  # group's typical spread per rank
        self.cusum = RobustCusum(
            (NDIM, world_size), cfg.straggler_cusum_h, cfg.straggler_cusum_clip
        )

    def reset(self) -> None:
        for ring in (self.excess, self.flags, self.steps, self._busy_share):
            ring.clear()
        self.cusum.reset()
        self.count[:] = 0
        self.since[:] = np.nan
        self._score_cache.clear()

    def forget(self, ranks: np.ndarray) -> None:
        """Start ``ranks`` afresh (they moved to another host: their window was another
        machine's): their rows read as absent until they report again, their CUSUM and
        runs of flags start from 0."""
        self.excess.rows[..., ranks] = np.nan
        self.steps.rows[..., ranks] = np.nan
        self.flags.rows[:, ranks] = 0
        self.count[ranks] = 0
        self.since[ranks] = np.nan
        self.cusum.forget(ranks)
        self._score_cache.clear()

    def update(self, cs: ClosedStep, groups: GroupIndex) -> None:
        """Score one closed step."""
        self._score_cache.clear()
        if groups.version != self._groups_version:
            self._noise.clear()
            self._sigma.clear()
            self._bnoise = None
            self._groups_version = groups.version
        busy, basis = self._metric(cs)
        self.basis = basis
        x = cs.m[DIM_ROWS] if basis == "phases" else np.full((NDIM, self.world_size), np.nan)
        if basis != "phases":
            x[0] = busy
        excess = np.full((NDIM, self.world_size), np.nan)
        flagged = np.zeros(self.world_size, dtype=np.int8)
        if not self._score_batch(groups, x, cs.comm, excess, flagged):
            for g, idx in enumerate(groups.members):
                if len(idx) < self.cfg.min_group_size:
                    continue
                self._score_group(g, idx, x, cs.comm, excess, flagged)
        old = self.flags.swap(flagged)
        started = (self.count == 0) & (flagged > 0)
        self.count += flagged
        self.count -= old
        self.now = cs.end_max
        self.since[started] = cs.end_max
        self.since[self.count == 0] = np.nan
        self.since_step[started] = cs.step
        self.excess.push(excess)
        self.steps.push(cs.m)
        step_s = cs.med[DUR] - (cs.med[PAUSE] if cs.med[PAUSE] == cs.med[PAUSE] else 0.0)
        center = cs.med[BUSY] if basis == "phases" else med(busy)
        self._busy_share.push(center / step_s if step_s > 0 else np.nan)
        ratio = self._ratio = med(self._busy_share.filled()[:, 0])
        kappa = self.cfg.straggler_material_share / (ratio if ratio > 0 else 1.0)
        self.cusum.update(
            excess, self.spread, kappa, flagged, np.isinf(self.threshold), cs.step, cs.end_max
        )
        self.step = cs.step
        if basis != "phases":
            self.steps.rows[self.steps.pos - 1, BUSY] = busy

    def _metric(self, cs: ClosedStep) -> tuple[np.ndarray, str]:
        if cs.has_phases and not np.isnan(cs.med[BUSY]):
            return cs.busy, "phases"
        med_dur = med(cs.dur)
        late_end = cs.end - med(cs.end)
        long_dur = cs.dur - med_dur
        # expressed as a busy-like time so that excess = lateness / median step time
        return med_dur + np.fmax(late_end, long_dur), "timestamps"

    def _score_group(
        self,
        g: int,
        idx: np.ndarray,
        x: np.ndarray,
        comm: np.ndarray,
        excess: np.ndarray,
        flagged: np.ndarray,
    ) -> None:
        xs = x[:, idx]  # (dims, members)
        busy = xs[0]
        present = ~np.isnan(busy)
        if present.sum() < self.cfg.min_group_size:
            return
        # absent ranks: NaN in every row, left out of the medians
        xs_ok = xs if present.all() else xs[:, present]
        center = med(busy[present])
        if not center > 0:
            return
        centers = rowmed(xs_ok)[:, None]
        e = (xs - centers) / center  # every dimension in units of busy time
        sigma = self._push_noise(g, MAD_SIGMA * rowmed(np.abs(xs_ok - centers)) / center)
        floor = self._floor
        c = comm[idx]
        comm_measured = (~np.isnan(c)).sum() >= self.cfg.min_group_size
        with np.errstate(invalid="ignore"):
            limit = np.fmax(floor, self.cfg.straggler_step_z * sigma)[:, None]
            over = e > limit
            if not comm_measured:
                over[_BWD_DIM] = False  # DDP: backward holds the peers' wait, not evidence
            hit = over.any(axis=0)
        if self.cfg.require_comm_corroboration and comm_measured:
            hit &= ~(c > med(c))  # NaN comm does not veto
        excess[:, idx] = e
        flagged[idx] = hit
        self.spread[:, idx] = sigma[:, None]
        # the score is a median of n steps: its noise is ~1.25 sigma / sqrt(n)
        thr = np.fmax(floor, self.cfg.straggler_z * 1.25 * sigma / self._sqrt_n)
        if not comm_measured:
            thr[_BWD_DIM] = np.inf
        self.threshold[:, idx] = thr[:, None]

    def _score_batch(
        self,
        groups: GroupIndex,
        x: np.ndarray,
        comm: np.ndarray,
        excess: np.ndarray,
        flagged: np.ndarray,
    ) -> bool:
        """Every group at once when they have the same size and every rank reported (the
        common case): the same numbers as :meth:`_score_group`, one partition per step."""
        if self._batch_version != groups.version:
            self._batch_version = groups.version
            n = len(groups.members[0])
            same = all(len(m) == n for m in groups.members) and n >= self.cfg.min_group_size
            self._batch = (np.concatenate(groups.members), len(groups.members), n) if same else None
        if self._batch is None:
            return False
        order, n_groups, n = self._batch
        identity = n_groups == 1 and n == self.world_size  # one group: ranks in order
        xs = (x if identity else x[:, order]).reshape(NDIM, n_groups, n)
        nan = np.isnan(xs)
        lanes = nan.any(axis=-1)
        if lanes[0].any() or (lanes != nan.all(axis=-1)).any():
            return False  # absent ranks or phases measured on some ranks only
        centers = _pmed(xs)  # (dims, groups)
        center = centers[0]
        if not (center > 0).all():
            return False
        dev = xs - centers[..., None]
        e = dev / center[:, None]
        sigma = self._batch_sigma(_pmed(np.abs(e)) * MAD_SIGMA, n_groups)
        cs = (comm if identity else comm[order]).reshape(n_groups, n)
        cnan = np.isnan(cs)
        measured = (~cnan).sum(axis=1) >= self.cfg.min_group_size
        over = e > np.fmax(self._floor2, self.cfg.straggler_step_z * sigma)[..., None]
        if not measured.all():
            over[_BWD_DIM, ~measured] = False  # DDP: backward holds the peers' wait
        hit = over.any(axis=0)
        if self.cfg.require_comm_corroboration and measured.any():
            cmed = _pmed(cs) if not cnan.any() else np.array([med(row) for row in cs])
            hit &= ~((cs > cmed[:, None]) & measured[:, None])
        thr = np.fmax(self._floor2, self._thr_scale * sigma)
        if not measured.all():
            thr[_BWD_DIM, ~measured] = np.inf
        if identity:
            excess[:] = e.reshape(NDIM, -1)
            flagged[:] = hit.reshape(-1)
            self.threshold[:] = thr
            self.spread[:] = sigma
        else:
            excess[:, order] = e.reshape(NDIM, -1)
            flagged[order] = hit.reshape(-1)
            self.threshold[:, order] = np.repeat(thr, n, axis=1)
            self.spread[:, order] = np.repeat(sigma, n, axis=1)
        return True

    def _batch_sigma(self, spread: np.ndarray, n_groups: int) -> np.ndarray:
        """The typical spread of every (dimension, group): one ring, refreshed every 4 steps."""
        ring = self._bnoise
        if ring is None or ring.rows.shape[1:] != spread.shape:
            ring = self._bnoise = Ring(NOISE_STEPS, spread.shape)
            self._bsigma = None
        ring.push(spread)
        if self._bsigma is None or ring.pos % 4 == 0:
            rows = ring.filled()
            self._bsigma = rowmed(rows.reshape(len(rows), -1).T).reshape(NDIM, n_groups)
        return self._bsigma

    def _push_noise(self, g: int, spread: np.ndarray) -> np.ndarray:
        noise = self._noise.get(g)
        if noise is None:
            noise = self._noise[g] = Ring(NOISE_STEPS, NDIM)
        noise.push(spread)
        sigma = self._sigma.get(g)
        if sigma is None or noise.pos % 4 == 0:  # the typical spread moves slowly
            sigma = self._sigma[g] = rowmed(noise.filled().T)
        return sigma

    def _scores(self, rank: int) -> np.ndarray:
        """Window median of each dimension's excess for ``rank`` (NaN: not measured); the
        same array until the next step (read-only for callers)."""
        out = self._score_cache.get(rank)
        if out is None:
            out = self._score_cache[rank] = nanmed(self.excess.filled()[:, :, rank], 0)
        return out

    def candidates(self) -> list[Candidate]:
        """Ranks whose flags persisted (k of n) and whose median excess is above threshold
        (material or not: see :attr:`Candidate.cost` and :meth:`material`)."""
        k = self.cfg.persist_steps
        out = []
        for rank in np.flatnonzero(self.count >= k).tolist():
            score, thr = self._best(rank, 1.0)
            if score > thr:
                out.append(
                    Candidate(
                        rank,
                        score,
                        int(self.count[rank]),
                        thr,
                        self.cost(score),
                        self.cusum.level(rank),
                    )
                )
        return out

    def cost(self, score: float) -> float:
        """An excess in units of the median busy time as a share of the median step time
        (pauses left out): 2x a 3 ms optimizer step costs 1 % of a 0.3 s step."""
        return score * self._ratio if self._ratio > 0 else score

    def host_cost(self, ranks: list[int], members: np.ndarray) -> float:
        """The cost of several ranks of one host measured against the peers *off* it.

        When a large share of a group is slow (half the job on one of two hosts), the
        group median sits between the slow and the healthy ranks and each slow rank's
        excess over it is about half the real one; the calm peers' median excess in the
        lead rank's dimension (negative there) is added back. The host's excess is that
        of its typical slow rank (the lower median of the ranks' excesses in that
        dimension), not its lead's: one slow rank beside a neighbour that noise made a
        candidate is a rank straggler, which must persist on its own (CUSUM) to count."""
        lead = max(ranks, key=self.score)
        d = self._dim(lead)
        each = np.array([self._scores(r)[d] for r in ranks])
        score = float(nanlowmed(np.where(np.isnan(each), 0.0, each)))
        calm = np.setdiff1d(members[self.count[members] == 0], ranks)
        if not len(calm):
            return self.cost(score)
        base = float(np.nanmedian(self.excess.filled()[:, d][:, calm]))
        return self.cost(score - min(base, 0.0)) if base == base else self.cost(score)

    def onset(self, ranks: list[int]) -> tuple[int, float] | None:
        """(first step, its start time) of the change on ``ranks``. When the window holds
        the jump, a change point in the lead rank's excess over it: the
        least-absolute-deviations split when its jump is significant (one noisy step does
        not pull it onto itself), else the least-squares split when the mean excess
        before it is under half the mean after it (what a small jump needs). Else the
        CUSUM's estimate (the step after its anchor, ``RobustCusum._anchor``), which
        also reaches back before the window; else the start of the rank's run of flags."""
        lead = max(ranks, key=self.score)
        scores = self._scores(lead)
        d = int(np.argmax(np.where(np.isnan(scores), -np.inf, scores - self.threshold[:, lead])))
        rows = self.excess.last(self.excess.count)
        series = rows[:, d, lead]
        k = self._window_split(series, float(self.spread[d, lead]), self.cusum.min_run)
        if k > 0:
            starts = self.steps.last(self.steps.count)[:, START, lead]
            return self.step - len(rows) + 1 + k, float(starts[k])
        est = self.cusum.onset(ranks)
        if est is not None:
            return est
        began = [r for r in ranks if self.since[r] == self.since[r]]  # their runs of flags
        if not began:
            return None
        first = min(began, key=lambda r: int(self.since_step[r]))
        return int(self.since_step[first]), float(self.since[first])

    @staticmethod
    def _window_split(series: np.ndarray, spread: float, min_after: int = 1) -> int:
        """Where the window's excess jumps (0: the window does not hold the jump).

        First the least-absolute-deviations split, kept when the median before it is
        under half the median after it and the step between the medians is ``ONSET_Z``
        standard errors (a median of m steps has about 1.25 x ``spread`` / sqrt(m); an
        unknown spread, NaN, refuses nothing): a large value weighs there by its distance,
        not its square. A jump too small for that test is judged as before this split
        existed: the least-squares split, kept when the mean before it is under half the
        mean after it (a noisy window of a weak fault fails both and goes to the CUSUM).
        """
        if np.isnan(series).any():
            return 0
        n = len(series)
        k = median_change_point(series, min_after)
        if k > 0:
            before, after = med(series[:k]), med(series[k:])
            error = 1.25 * spread * float(np.sqrt(1.0 / k + 1.0 / (n - k)))
            if before < 0.5 * after and not after - before < ONSET_Z * error:
                return k
        k = change_point(series, min_after)
        if (
            k > 0
            and float(np.mean(series[:k])) < 0.5 * float(np.mean(series[k:]))
            and med(series[:k]) < 0.5 * med(series[k:])
        ):
            return k
        return 0

    def material(self, c: Candidate) -> bool:
        """Whether a candidate is incident grade: its excess costs the step enough and its
        robust CUSUM crossed its alarm level (evidence accumulated, not one noisy window)."""
        return c.cost >= self.cfg.straggler_material_share and c.cusum >= self.cusum.h

    def lasted(self, ranks: list[int]) -> bool:
        """Whether the earliest run of flags among ``ranks`` (one rank, or the slow ranks
        of one host: one fault) began at least ``straggler_min_seconds`` ago."""
        return self.lasted_for(ranks) >= self.cfg.straggler_min_seconds

    def lasted_for(self, ranks: list[int]) -> float:
        """Seconds since the earliest run of flags among ``ranks`` began (0: none runs)."""
        began = self.since[ranks]
        began = began[~np.isnan(began)]
        return self.now - float(began.min()) if len(began) else 0.0

    def _dim(self, rank: int, ratio: float = 1.0) -> int:
        """The dimension of ``rank`` most over its threshold x ``ratio``."""
        scores = self._scores(rank)
        with np.errstate(invalid="ignore"):
            margin = np.where(np.isnan(scores), -np.inf, scores - self.threshold[:, rank] * ratio)
        return int(np.argmax(margin))

    def _best(self, rank: int, ratio: float) -> tuple[float, float]:
        """The dimension most over its threshold: (its score, its threshold x ratio)."""
        d = self._dim(rank, ratio)
        score = float(self._scores(rank)[d])  # finite or NaN (not measured): NaN counts as 0
        return (score if score == score else 0.0), float(self.threshold[d, rank] * ratio)

    def way(self, rank: int) -> str | None:
        """How ``rank`` is slow: the kind of work (``input``: its data phase, ``compute``:
        forward, backward, optimizer, other; ``transfer``) whose phase has its largest
        excess over its peers. None without phases (timestamps only) or without excess."""
        scores = self._scores(rank)
        best, way = 0.0, None
        for d, name in enumerate(DIM_NAMES[1:], start=1):
            s = float(scores[d])
            if s == s and s > best:
                best, way = s, _WAY_OF_PHASE[name]
        return way

    def alike(self, ranks: list[int], way: str | None = None) -> list[int]:
        """The ranks slowed in the same way as the slowest of them (its lead), or as
        ``way``: one host-level fault slows its ranks in one way, by however much each.
        A rank whose data phase stalls beside a neighbour that computes slower are two
        faults, not one host. A rank whose way is unknown (no phases) goes with any."""
        if way is None:
            way = self.way(max(ranks, key=self.score))
        if way is None:
            return list(ranks)
        return [r for r in ranks if self.way(r) in (way, None)]

    def score(self, rank: int) -> float:
        return self._best(rank, 1.0)[0]

    def rising(self, rank: int) -> bool:
        """Flagged in a few steps with a window median over half its threshold (host peers)."""
        if self.count[rank] < 2:
            return False
        score, thr = self._best(rank, 0.5)
        return score > thr

    def still_slow(self, rank: int) -> tuple[bool, float]:
        """Whether an open straggler still holds (hysteresis), and its current score."""
        score, thr = self._best(rank, self.cfg.straggler_clear_ratio)
        return bool(score > thr), score

    def any_rising(self, limit: int = 16) -> bool:
        """Some rank is on its way to a straggler verdict (see :meth:`rising`)."""
        ranks = np.flatnonzero(self.count >= 2)[:limit]
        return any(self.rising(int(r)) for r in ranks)

    def suspicious(self) -> bool:
        """Any rank flagged in more than one step of the window (suppresses job_slowdown)."""
        return bool((self.count >= max(2, self.cfg.persist_steps - 2)).any())

    def longer_phases(self, rank: int) -> dict[str, float]:
        """The phases (not the sum) whose window median is over their threshold: excess each."""
        scores = self._scores(rank)
        out = {}
        for d in range(1, NDIM):
            s = scores[d]
            if s == s and s > self.threshold[d, rank]:
                out[DIM_NAMES[d]] = round(float(s), 4)
        return out

    def evidence(
        self,
        rank: int,
        members: np.ndarray,
        since: int | None = None,
        peers_of: np.ndarray | None = None,
    ) -> Evidence:
        """The numbers behind a rank's score: its medians against its group's, in seconds,
        over the window's steps from ``since`` on (the estimated onset; at least 3 steps);
        ``peers_of``: the ranks to compare with (default: the group's calm ranks)."""
        longer = self.longer_phases(rank)
        out: Evidence = {
            "basis": self.basis,
            "flagged_steps": int(self.count[rank]),
            "window_steps": self.cfg.window_steps,
            "threshold": round(self._best(rank, 1.0)[1], 4),
            "group_size": len(members),
            "phases_longer": ",".join(longer),
            **{f"{p}_excess": v for p, v in longer.items()},
        }
        window = self.steps.filled()
        if since is not None:
            window = self.steps.last(max(3, self.step - since + 1))
        # peers: the group without the ranks flagged in the window (half a group may be slow)
        calm = members[self.count[members] == 0]
        peers_idx = calm if len(calm) >= self.cfg.min_group_size else members
        if peers_of is not None and len(peers_of):
            peers_idx = peers_of
        sel = window[:, _EVIDENCE_ROWS]  # (steps, rows, ranks)
        own = nanmed(sel[:, :, rank], 0)
        peers = nanmed(nanmed(sel[:, :, peers_idx], -1), 0)  # median over steps of step medians
        for i, name in enumerate(_EVIDENCE_NAMES):
            out[f"{name}_s"] = opt(round(float(own[i]), 6))
            out[f"{name}_peer_median_s"] = opt(round(float(peers[i]), 6))
        own_busy = float(own[0])
        medians = colmed(window[:, BUSY][:, members])
        medians = medians[medians > 0]
        if len(medians) and own_busy > 0:
            out["nvrx_relative"] = round(float(medians.min()) / own_busy, 4)  # min of medians / own
        return out


def _pmed(a: np.ndarray) -> np.ndarray:
    """Median along the last axis of an array whose lanes are complete or all NaN."""
    n = a.shape[-1]
    h = n // 2
    if n % 2:
        return np.partition(a, h, axis=-1)[..., h]
    p = np.partition(a, (h - 1, h), axis=-1)
    return (p[..., h - 1] + p[..., h]) * 0.5
