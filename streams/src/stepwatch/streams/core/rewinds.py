"""Restarts from a checkpoint, told apart from late, skewed and forged step records.

A step number going back is a restart (a *rewind*) only when enough ranks say
so, each by its own history on its own host's clock:

* a rank **went back** when it reports a step no later than one it reported in a
  closed step of this run, starting after the end of the latest step it
  reported (both on its host's clock, so a peer host's clock offset plays no
  part). A step closed with fewer than half of the ranks that reported the
  recent steps (one forged record far ahead, closed on its deadline) is no
  rank's history;
* the records of ranks that went back are **held**, and so are the later records
  of those ranks (the new run goes on while it is held);
* a held rank that reports its **old run going on** (a step past its last closed
  one, starting before its held record) did not restart: its held records are
  dropped as late. A copy of a step it had reported is only late;
* once ranks that went back make **half of the ranks** that reported the recent
  closed steps (the most of the last ``RECENT_STEPS``), the job rewinds to the
  step most of them went back to (records of earlier steps are late), with the
  median of their own gaps, and the held records are assembled as the new
  run's. The history starts over with the new run;
* held records that never reach that quorum are dropped as late after
  ``HOLD_SECONDS``; at most ``per_rank`` records a rank are held (the
  assembler's bound on open steps: a host's message of fast steps holds many).

Before, one record did it: a late record from a host whose clock is ahead of its
peers', or one forged record, restarted the job (its open detections resolved,
ten steps not scored). A forger who writes records for half of a job's ranks in
the job's own step pattern still can; docs/security.md says so.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import StepRecord

HOLD_SECONDS = 60.0  # held records not joined by half the job's ranks by then are late
RECENT_STEPS = 8  # closed steps whose largest rank count is the quorum's base


@dataclass(frozen=True, slots=True)
class Confirmed:
    """A rewind the ranks agreed on: the step it went back to, the restart's gap (seconds:
    the median of those ranks' own gaps, each on its host's clock) and the held records
    in arrival order."""

    to_step: int
    gap_seconds: float
    records: list[tuple[StepRecord, float | None]]
    starts: dict[int, float]  # held rank -> the start of its first held record


class RewindWatch:
    """Each rank's latest closed step and end, and the records of ranks that went back."""

    def __init__(self, world_size: int, per_rank: int) -> None:
        self.step = np.full(world_size, -1, np.int64)  # latest closed step it reported
        self.end = np.full(world_size, -np.inf)  # the end of its latest reported step
        self.per_rank = per_rank  # records held a rank, at most (the rest are late)
        self.late = 0  # held records dropped (late after all)
        self._reported: deque[int] = deque(maxlen=RECENT_STEPS)  # ranks of recent steps
        self._clear()

    def _clear(self) -> None:
        self.held: list[tuple[StepRecord, float | None]] = []
        self.starts: dict[int, float] = {}  # held rank -> start of its first held record
        self.firsts: dict[int, int] = {}  # held rank -> step of its first held record
        self.counts: dict[int, int] = {}  # held rank -> its records held
        self.since: float | None = None  # the engine's clock at the first held record
        self.agreed = False  # half the ranks went back: rewind

    # ------------------------------------------------------------------ history
    def closed(self, step: int, present: np.ndarray, ends: np.ndarray) -> None:
        """A step closed: ``present`` ranks reported it, ending at ``ends`` (NaN: absent)."""
        n = int(np.count_nonzero(present))
        expected = self.expected()
        self._reported.append(n)
        if 2 * n < expected:
            return  # too few ranks to be anyone's history (a forged step far ahead)
        self.step[present] = step
        np.fmax(self.end, ends, out=self.end)

    def restart(self) -> None:
        """The job rewound: history starts over with the new run."""
        self.step[:] = -1
        self.end[:] = -np.inf

    def expected(self) -> int:
        """The most ranks that reported one of the recent closed steps (the quorum's base)."""
        return max(self._reported, default=1)

    def went_back(self, rec: StepRecord) -> bool:
        """Whether ``rec`` is its rank's step going back after its own latest end."""
        rank = rec.rank
        return bool(self.step[rank] >= rec.step and rec.start >= self.end[rank])

    # ------------------------------------------------------------------ holding
    def hold(self, rec: StepRecord, arrived: float | None) -> None:
        """Hold a record of a rank that went back (or of the new run of a held rank)."""
        clock = rec.end if arrived is None else arrived
        rank = rec.rank
        n = self.counts.get(rank, 0)
        if n >= self.per_rank:
            self.late += 1
            return
        self.counts[rank] = n + 1
        self.held.append((rec, arrived))
        if rank not in self.starts:
            self.starts[rank], self.firsts[rank] = rec.start, rec.step
        if self.since is None:
            self.since = clock
        self.agreed = 2 * len(self.starts) >= self.expected()

    def follows(self, rec: StepRecord, arrived: float | None) -> bool:
        """A later record of a held rank: held with the new run (True); or not (False:
        assemble it as usual), and if it is the rank's old run going on, its held records
        are dropped."""
        rank = rec.rank
        if rec.start >= self.starts[rank]:
            self.hold(rec, arrived)
            return True
        if rec.step <= self.step[rank]:
            return False  # a copy of a step it had reported: late, the hold stands
        keep = [(r, a) for r, a in self.held if r.rank != rank]
        self.late += len(self.held) - len(keep)
        del self.starts[rank], self.firsts[rank], self.counts[rank]
        if not keep:
            self._clear()
            return False
        self.held = keep
        self.agreed = 2 * len(self.starts) >= self.expected()
        return False

    # ------------------------------------------------------------------ the verdict
    def take(self) -> Confirmed:
        """The agreed rewind: to the step most held ranks went back to (their records of
        earlier steps are late), the median of their own gaps; the held records handed
        over."""
        firsts = Counter(self.firsts.values())
        to_step = min(s for s, n in firsts.items() if n == max(firsts.values()))
        gaps = [self.starts[r] - float(self.end[r]) for r, s in self.firsts.items() if s == to_step]
        held = [(r, a) for r, a in self.held if r.step >= to_step]
        self.late += len(self.held) - len(held)
        starts = self.starts
        self._clear()
        return Confirmed(to_step, float(np.median(gaps)), held, starts)

    def old_run_before(self, c: Confirmed) -> list[float]:
        """Per rank, the start (on its own host's clock) before which a record of it is
        its old run's, for the rewind ``c`` (call before ``restart``): a record held up
        (a host's link down, its spool sent later) that arrives after the restart must
        not fill the new run's step of its number.

        A rank that went back: the start of its first record of the new run. Another
        rank: the end of its latest reported step, plus the steps the job closed after
        it (at the new run's median step time), plus the restart's gap: when the job's
        last closed step ended on that rank's clock, and the new run began ``gap``
        later. Less a margin of half the gap, at least two steps (a record of the new
        run out of order, an estimate off by a step). A rank with no step reported: no
        bound."""
        durations = [r.end - r.start for r, _ in c.records]
        step_s = float(np.median(durations)) if durations else 0.0
        margin = max(c.gap_seconds / 2, 2 * step_s)
        last = int(self.step.max())
        began = self.end + (last - self.step) * step_s + c.gap_seconds
        began[self.step < 0] = -np.inf
        for rank, start in c.starts.items():
            began[rank] = start
        return [float(b) for b in began - margin]

    def expire(self, now: float) -> None:
        """Held records that no quorum joined within ``HOLD_SECONDS`` are late."""
        if self.since is not None and now >= self.since + HOLD_SECONDS:
            self.late += len(self.held)
            self._clear()
