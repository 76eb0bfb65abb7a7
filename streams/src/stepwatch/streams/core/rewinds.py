"""Restarts from a checkpoint, told apart from late, skewed and forged step records.

A step number going back is a restart (a *rewind*) only when enough ranks say
so, each by its own history on its own host's clock:

* a rank **went back** when it reports a step no later than one it reported in a
  closed step, starting after the end of the latest step it reported (both on
  its host's clock, so a peer host's clock offset plays no part);
* the records of ranks that went back are **held**, and so are the later records
  of those ranks (the new run goes on while it is held);
* a held rank that reports its **old run going on** (a record starting before
  its held one) did not restart: its held records are dropped as late;
* once ranks that went back make **half of the ranks** that reported the last
  closed step (at least one), the job rewinds and the held records are
  assembled as the new run's;
* held records that never reach that quorum are dropped as late after
  ``HOLD_SECONDS``; at most ``per_rank`` records a rank are held (the
  assembler's bound on open steps: a host's message of fast steps holds many).

Before, one record did it: a late record from a host whose clock is ahead of its
peers', or one forged record, restarted the job (its open detections resolved,
ten steps not scored). A forger who writes records for half of a job's ranks in
the job's own step pattern still can; docs/security.md says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepwatch.contract import StepRecord

HOLD_SECONDS = 60.0  # held records not joined by half the job's ranks by then are late


@dataclass(frozen=True, slots=True)
class Confirmed:
    """A rewind the ranks agreed on: the step it went back to, the restart's gap (seconds,
    on the first held rank's own clock) and the held records in arrival order."""

    to_step: int
    gap_seconds: float
    records: list[tuple[StepRecord, float | None]]


class RewindWatch:
    """Each rank's latest closed step and end, and the records of ranks that went back."""

    def __init__(self, world_size: int, per_rank: int) -> None:
        self.step = np.full(world_size, -1, np.int64)  # latest closed step it reported
        self.end = np.full(world_size, -np.inf)  # the end of its latest reported step
        self.per_rank = per_rank  # records held a rank, at most (the rest are late)
        self.late = 0  # held records dropped (late after all), not yet counted
        self._clear()

    def _clear(self) -> None:
        self.held: list[tuple[StepRecord, float | None]] = []
        self.starts: dict[int, float] = {}  # held rank -> start of its first held record
        self.counts: dict[int, int] = {}  # held rank -> its records held
        self.since: float | None = None  # the engine's clock at the first held record
        self.agreed = False  # half the ranks went back: rewind
        self._expected = 1

    # ------------------------------------------------------------------ history
    def closed(self, step: int, present: np.ndarray, ends: np.ndarray) -> None:
        """A step closed: ``present`` ranks reported it, ending at ``ends`` (NaN: absent)."""
        self.step[present] = step
        np.fmax(self.end, ends, out=self.end)

    def went_back(self, rec: StepRecord) -> bool:
        """Whether ``rec`` is its rank's step going back after its own latest end."""
        rank = rec.rank
        return bool(self.step[rank] >= rec.step and rec.start >= self.end[rank])

    # ------------------------------------------------------------------ holding
    def holds(self, rank: int) -> bool:
        return rank in self.starts

    def hold(self, rec: StepRecord, arrived: float | None, expected: int) -> None:
        """Hold a record of a rank that went back; ``expected``: the ranks that reported
        the last closed step."""
        clock = rec.end if arrived is None else arrived
        n = self.counts.get(rec.rank, 0)
        if n >= self.per_rank:
            self.late += 1
            return
        self.counts[rec.rank] = n + 1
        self.held.append((rec, arrived))
        self.starts.setdefault(rec.rank, rec.start)
        if self.since is None:
            self.since = clock
        self._expected = max(expected, 1)
        self.agreed = 2 * len(self.starts) >= self._expected

    def follows(self, rec: StepRecord, arrived: float | None) -> bool:
        """A later record of a held rank: held with the new run (True), or its old run
        going on, which drops that rank's held records (False: assemble it as usual)."""
        if rec.start >= self.starts[rec.rank]:
            self.hold(rec, arrived, self._expected)
            return True
        keep = [(r, a) for r, a in self.held if r.rank != rec.rank]
        self.late += len(self.held) - len(keep)
        del self.starts[rec.rank], self.counts[rec.rank]
        if not keep:
            self._clear()
            return False
        self.held = keep
        return False

    # ------------------------------------------------------------------ the verdict
    def take(self) -> Confirmed:
        """The confirmed rewind; the held records are handed over."""
        held = self.held
        first = held[0][0]
        gap = first.start - float(self.end[first.rank])
        out = Confirmed(min(r.step for r, _ in held), gap, held)
        self._clear()
        return out

    def expire(self, now: float) -> None:
        """Held records that no quorum joined within ``HOLD_SECONDS`` are late."""
        if self.since is not None and now >= self.since + HOLD_SECONDS:
            self.late += len(self.held)
            self._clear()
