"""Assemble each training step across ranks, with a deadline for late or missing ranks.

Step records of one job arrive from many hosts, out of order and sometimes
twice (at-least-once delivery). :class:`StepAssembler` keeps the open steps of
one job, drops duplicates by (rank, step), and hands out :class:`ClosedStep`
arrays (indexed by rank, NaN where a rank is missing) strictly in step order:
a step closes when every expected rank reported, or when the event-time clock
passes its latest record's end plus the deadline. A step number going back with
records that start after the last closed step ended is a restart from a
checkpoint (a *rewind*), not a late record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stepwatch.contract import Phases, StepRecord

_EMPTY_PHASES = Phases()
NAN = float("nan")


@dataclass(frozen=True, slots=True)
class ClosedStep:
    """One step of one job across its ranks; per-rank arrays have ``world_size`` entries."""

    step: int
    world_size: int
    records: list[StepRecord]
    present: np.ndarray  # bool
    start: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    data: np.ndarray  # NaN where unmeasured
    compute: np.ndarray  # forward + backward + optimizer + other named sections
    xfer: np.ndarray  # the rank's own transfer sections (extra "comm*", "nccl*", "*transfer*")
    comm: np.ndarray  # exposed wait in collectives
    ckpt: np.ndarray
    pause: np.ndarray  # checkpoint + evaluation sections: job-wide pauses, not work
    has_phases: bool
    samples: int
    tokens: int
    flops: float | None
    end_max: float
    nonfinite_ranks: tuple[int, ...]

    @property
    def complete(self) -> bool:
        return len(self.records) == self.world_size

    def missing(self) -> list[int]:
        return np.flatnonzero(~self.present).tolist()


@dataclass(slots=True)
class _Pending:
    ranks: set[int] = field(default_factory=set)
    records: list[StepRecord] = field(default_factory=list)
    max_end: float = 0.0


@dataclass(frozen=True, slots=True)
class Rewind:
    """The job went back to an earlier step (restart from a checkpoint)."""

    from_step: int
    to_step: int
    gap_seconds: float  # from the last closed step's end to the new step's start


class StepAssembler:
    """Open steps of one job; see the module docstring."""

    def __init__(self, world_size: int, deadline: float, max_pending: int) -> None:
        self.world_size = world_size
        self.deadline = deadline
        self.max_pending = max_pending
        self.last_closed = -1
        self.last_closed_end = 0.0
        self.absent: set[int] = set()  # ranks missing from the last closed step
        self.duplicates = 0
        self.late = 0
        self.rewinds: list[Rewind] = []
        self._pending: dict[int, _Pending] = {}

    @property
    def pending_steps(self) -> int:
        return len(self._pending)

    def add(self, records: list[StepRecord]) -> list[ClosedStep]:
        """Add records of this job; return the steps that closed, in order."""
        pending = self._pending
        ready = False
        for rec in records:
            step = rec.step
            if step <= self.last_closed and not self._late_or_rewind(rec):
                continue
            p = pending.get(step)
            if p is None:
                p = pending[step] = _Pending()
            rank = rec.rank
            if rank in p.ranks:
                self.duplicates += 1
                continue
            p.ranks.add(rank)
            p.records.append(rec)
            if rec.end > p.max_end:
                p.max_end = rec.end
            if len(p.ranks) >= self.world_size - len(self.absent):
                ready = True
        if ready or len(pending) > self.max_pending:
            return self._drain(None)
        return []

    def expire(self, now: float) -> list[ClosedStep]:
        """Close the steps whose deadline passed at event time ``now``."""
        return self._drain(now)

    def _late_or_rewind(self, rec: StepRecord) -> bool:
        """True when ``rec`` starts a rewind (and the state was reset for it)."""
        if rec.start < self.last_closed_end:
            self.late += 1
            self.absent.discard(rec.rank)  # alive, only late: wait for it again
            return False
        gap = rec.start - self.last_closed_end
        self.rewinds.append(Rewind(self.last_closed, rec.step, gap))
        self._pending.clear()
        self.absent.clear()
        self.last_closed = rec.step - 1
        return True

    def _complete(self, p: _Pending) -> bool:
        n = len(p.ranks)
        if n >= self.world_size:
            return True
        if not self.absent or n < self.world_size - len(self.absent):
            return False
        return len(p.ranks - self.absent) == self.world_size - len(self.absent)

    def _drain(self, now: float | None) -> list[ClosedStep]:
        closed: list[ClosedStep] = []
        pending = self._pending
        while pending:
            step = min(pending)
            p = pending[step]
            overflow = len(pending) > self.max_pending
            expired = now is not None and now >= p.max_end + self.deadline
            if not (overflow or expired or self._complete(p)):
                break
            del pending[step]
            closed.append(self._close(step, p))
        return closed

    def _close(self, step: int, p: _Pending) -> ClosedStep:
        self.last_closed = step
        if p.max_end > self.last_closed_end:
            self.last_closed_end = p.max_end
        out = build_step(step, self.world_size, p.records)
        if out.complete:
            self.absent.clear()
        else:
            self.absent = set(out.missing())
        return out


def build_step(step: int, world_size: int, records: list[StepRecord]) -> ClosedStep:
    """Scatter the records of one step into per-rank arrays."""
    w = world_size
    n = len(records)
    ranks = np.fromiter((r.rank for r in records), np.intp, n)
    present = np.zeros(w, bool)
    present[ranks] = True

    def scatter(values: list) -> np.ndarray:
        out = np.full(w, NAN)
        out[ranks] = np.array(values, dtype=float)
        return out

    start = scatter([r.start for r in records])
    end = scatter([r.end for r in records])
    phases = [r.phases or _EMPTY_PHASES for r in records]
    has_phases = any(r.phases is not None for r in records)
    if has_phases:
        data = scatter([p.data for p in phases])
        fwd = np.array([p.forward for p in phases], dtype=float)
        bwd = np.array([p.backward for p in phases], dtype=float)
        opt = np.array([p.optimizer for p in phases], dtype=float)
        other, xfer, evals = _split_extra(phases)
        parts = np.stack([fwd, bwd, opt, other])
        measured = ~np.isnan(parts).all(axis=0)
        compute = scatter(np.where(measured, np.nansum(parts, axis=0), NAN).tolist())
        xfer_a = scatter(xfer)
        comm = scatter([p.comm_wait for p in phases])
        ckpt = scatter([p.checkpoint for p in phases])
        pause = np.nan_to_num(ckpt) + scatter(evals)
    else:
        data = compute = xfer_a = comm = ckpt = np.full(w, NAN)
        pause = np.zeros(w)
    flops_list = [r.flops for r in records if r.flops is not None]
    return ClosedStep(
        step=step,
        world_size=w,
        records=records,
        present=present,
        start=start,
        end=end,
        dur=end - start,
        data=data,
        compute=compute,
        xfer=xfer_a,
        comm=comm,
        ckpt=ckpt,
        pause=pause,
        has_phases=has_phases,
        samples=sum(r.samples for r in records),
        tokens=sum(r.tokens for r in records),
        flops=sum(flops_list) if flops_list else None,
        end_max=float(np.nanmax(end)),
        nonfinite_ranks=tuple(r.rank for r in records if r.loss_nonfinite),
    )


PAUSE_SECTIONS = frozenset({"eval", "evaluation", "validation", "val"})


def _split_extra(phases: list[Phases]) -> tuple[list[float], list[float], list[float]]:
    """Extra sections per rank as (other work, own transfers, evaluation pauses)."""
    n = len(phases)
    if not any(p.extra for p in phases):
        return [NAN] * n, [0.0] * n, [0.0] * n
    other, xfer, evals = [NAN] * n, [0.0] * n, [0.0] * n
    for i, p in enumerate(phases):
        for name, value in p.extra.items():
            low = name.lower()
            if low in PAUSE_SECTIONS:
                evals[i] += value
            elif low.startswith(("comm", "nccl")) or "transfer" in low:
                xfer[i] += value
            else:
                other[i] = value if other[i] != other[i] else other[i] + value
    return other, xfer, evals
