"""Assemble each training step across ranks, with a deadline for late or missing ranks.

Step records of one job arrive from many hosts, out of order and sometimes
twice (at-least-once delivery). :class:`StepAssembler` keeps the open steps of
one job, drops duplicates by (rank, step), and hands out :class:`ClosedStep`
arrays (indexed by rank, NaN where a rank is missing) strictly in step order:
a step closes when every expected rank reported, or when the engine's clock
passes the arrival of its latest record plus the deadline (replay: the clock is
event time and a record arrives at its message's timestamp; the live worker:
its own clock, so hosts' clock offsets do not close steps early). A step number
going back is a late record, or a restart from a checkpoint (a *rewind*) once
half the job's ranks went back, each after its own latest step
(:mod:`stepwatch.streams.core.rewinds`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import cast

import numpy as np

from stepwatch.contract import Phases, StepRecord
from stepwatch.streams.core.packing import layout
from stepwatch.streams.core.rewinds import RewindWatch
from stepwatch.streams.core.stats import rowmed

_EMPTY_PHASES = Phases()
NAN = float("nan")


# Rows of ClosedStep.m, each indexed by rank (NaN where missing or unmeasured).
START, END, DUR, DATA, COMPUTE, XFER, COMM, CKPT, PAUSE, BUSY, OTHER = range(11)
FWD, BWD, OPT, EXTRA = range(11, 15)  # the compute phases one by one (EXTRA: other sections)
CPUW, CPUT = 15, 16  # the training thread's CPU run-queue wait and CPU time: not phases
ROWS = 17
# The phases compared with the peers one by one (a DDP straggler's forward is longer
# while its backward, where the peers wait, is shorter: equal sums, unequal phases).
PHASE_ROWS = (DATA, FWD, BWD, OPT, EXTRA, XFER)
PHASE_NAMES = ("data", "forward", "backward", "optimizer", "other", "transfer")


@dataclass(frozen=True, slots=True)
class ClosedStep:
    """One step of one job across its ranks.

    ``m`` holds one row per quantity (the constants above), one column per rank:
    ``compute`` is forward + backward + optimizer + other named sections;
    ``xfer`` the rank's own transfer sections (extra ``comm*``, ``nccl*``,
    ``*transfer*``); ``comm`` the exposed wait in collectives; ``pause`` the
    checkpoint and evaluation sections (job-wide pauses, not work); ``busy``
    data + compute + xfer; ``other`` what the phases leave unexplained; ``cpuw`` and
    ``cput`` the CPU run-queue wait and CPU time (they overlap the phases).
    ``med`` holds the median of each row over the ranks.
    """

    step: int
    world_size: int
    records: list[StepRecord]
    present: np.ndarray  # bool
    m: np.ndarray
    med: np.ndarray
    has_phases: bool
    samples: int
    tokens: int
    flops: float | None
    end_max: float
    start_min: float
    nonfinite_ranks: tuple[int, ...]

    @property
    def start(self) -> np.ndarray:
        return cast("np.ndarray", self.m[START])

    @property
    def end(self) -> np.ndarray:
        return cast("np.ndarray", self.m[END])

    @property
    def dur(self) -> np.ndarray:
        return cast("np.ndarray", self.m[DUR])

    @property
    def data(self) -> np.ndarray:
        return cast("np.ndarray", self.m[DATA])

    @property
    def compute(self) -> np.ndarray:
        return cast("np.ndarray", self.m[COMPUTE])

    @property
    def xfer(self) -> np.ndarray:
        return cast("np.ndarray", self.m[XFER])

    @property
    def comm(self) -> np.ndarray:
        return cast("np.ndarray", self.m[COMM])

    @property
    def ckpt(self) -> np.ndarray:
        return cast("np.ndarray", self.m[CKPT])

    @property
    def pause(self) -> np.ndarray:
        return cast("np.ndarray", self.m[PAUSE])

    @property
    def busy(self) -> np.ndarray:
        return cast("np.ndarray", self.m[BUSY])

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
    arrived: float = 0.0  # the engine's clock when its latest record came


@dataclass(frozen=True, slots=True)
class Rewind:
    """The job went back to an earlier step (restart from a checkpoint)."""

    from_step: int
    to_step: int
    gap_seconds: float  # from the last closed step's end to the new step's start
    started_at: float | None = None  # when the new run began (its ranks' first starts)


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
        self._late = 0  # see ``late``
        self.rewinds: list[Rewind] = []
        self.newest_end = 0.0  # the latest end of a record taken into a step (not held, late)
        self.watch = RewindWatch(world_size, max_pending)
        # after a rewind, per rank: a record starting before this is the old run's (late)
        self.old_run_before: list[float] | None = None
        self._pending: dict[int, _Pending] = {}

    @property
    def late(self) -> int:
        """Records of steps already closed, not used (held records dropped included)."""
        return self._late + self.watch.late

    @late.setter
    def late(self, value: int) -> None:
        self._late = value - self.watch.late

    @property
    def pending_steps(self) -> int:
        return len(self._pending)

    def add(self, records: list[StepRecord], arrived: float | None = None) -> list[ClosedStep]:
        """Add records of this job that came at ``arrived`` on the engine's clock (None:
        at the latest record's end); return the steps that closed, in order."""
        whole = self._add_whole(records, arrived)
        ready = self._add_each(records, arrived) if whole is None else whole
        if self.watch.agreed:
            self._rewind()
            ready = True
        if ready or len(self._pending) > self.max_pending:
            return self._drain(None)
        return []

    def _add_whole(self, records: list[StepRecord], arrived: float | None) -> bool | None:
        """:meth:`_add_each` for the common message (one host's ranks at one step): the
        records all of one open step, no rank twice nor already in it, none held for a
        restart nor of the run before one. Whether the step is complete; None when the
        message is not such a one (nothing was taken: :meth:`_add_each` decides record by
        record)."""
        if not records or self.watch.starts:
            return None
        step = records[0].step
        if step <= self.last_closed:
            return None
        for r in records:
            if r.step != step:
                return None
        old_run = self.old_run_before
        if old_run is not None:  # since a restart: none of the old run's, held up
            for r in records:
                if r.start < old_run[r.rank]:
                    return None
        ranks = {r.rank for r in records}
        p = self._pending.get(step)
        if len(ranks) != len(records) or (p is not None and not p.ranks.isdisjoint(ranks)):
            return None
        if p is None:
            p = self._pending[step] = _Pending()
        p.ranks |= ranks
        p.records.extend(records)
        end = max([r.end for r in records])
        if end > p.max_end:
            p.max_end = end
            if end > self.newest_end:
                self.newest_end = end
        p.arrived = p.max_end if arrived is None else arrived
        return len(p.ranks) >= self.world_size - len(self.absent)

    def _add_each(self, records: list[StepRecord], arrived: float | None) -> bool:
        """Take the records one by one (held, late, duplicate or into their step);
        whether a step became complete."""
        pending = self._pending
        ready = False
        # a message's records are mostly of one step: its entry is looked up once per run
        last_closed, need = self.last_closed, self.world_size - len(self.absent)
        p, p_step = _Pending(), -1
        watch, old_run = self.watch, self.old_run_before
        for rec in records:
            step = rec.step
            if watch.starts and rec.rank in watch.starts and watch.follows(rec, arrived):
                continue  # the new run of a rank that went back: held
            if old_run is not None and rec.start < old_run[rec.rank]:
                self._late += 1  # the old run's, held up until after the restart
                continue
            if step <= last_closed:
                self._late_or_held(rec, arrived)
                need = self.world_size - len(self.absent)  # a late rank is alive
                continue
            if step != p_step:
                got = pending.get(step)
                if got is None:
                    got = pending[step] = _Pending()
                p, p_step = got, step
            rank = rec.rank
            if rank in p.ranks:
                self.duplicates += 1
                continue
            p.ranks.add(rank)
            p.records.append(rec)
            if rec.end > p.max_end:
                p.max_end = rec.end
                if rec.end > self.newest_end:
                    self.newest_end = rec.end
            p.arrived = p.max_end if arrived is None else arrived
            if len(p.ranks) >= need:
                ready = True
        return ready

    def expire(self, now: float) -> list[ClosedStep]:
        """Close the steps whose deadline passed at ``now`` on the engine's clock: the
        deadline counts from the arrival of a step's latest record, so a host whose clock
        is behind its peers' does not close their steps before they report."""
        self.watch.expire(now)
        return self._drain(now)

    def _late_or_held(self, rec: StepRecord, arrived: float | None) -> None:
        """A record of a step already closed: its rank went back (held until half the job
        did), or it is late."""
        if self.watch.went_back(rec):
            self.watch.hold(rec, arrived)
            return
        self._late += 1
        self.absent.discard(rec.rank)  # alive, only late: wait for it again

    def _rewind(self) -> None:
        """Half the job's ranks went back: the open steps are dropped and the held records
        placed as the new run's."""
        confirmed = self.watch.take()
        self.old_run_before = self.watch.old_run_before(confirmed)
        self.watch.restart()
        began = float(np.median(list(confirmed.starts.values()))) if confirmed.starts else None
        self.rewinds.append(
            Rewind(self.last_closed, confirmed.to_step, confirmed.gap_seconds, began)
        )
        self._late += sum(len(p.records) for p in self._pending.values())  # the old run's
        self._pending.clear()
        self.absent.clear()
        self.last_closed = confirmed.to_step - 1
        for rec, arrived in confirmed.records:
            self._place(rec, arrived)

    def _place(self, rec: StepRecord, arrived: float | None) -> None:
        p = self._pending.get(rec.step)
        if p is None:
            p = self._pending[rec.step] = _Pending()
        if rec.rank in p.ranks:
            self.duplicates += 1
            return
        p.ranks.add(rec.rank)
        p.records.append(rec)
        p.max_end = max(p.max_end, rec.end)
        p.arrived = p.max_end if arrived is None else arrived
        self.newest_end = max(self.newest_end, rec.end)

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
            expired = now is not None and now >= p.arrived + self.deadline
            if not (overflow or expired or self._complete(p)):
                break
            del pending[step]
            if self._stray(step, p):
                self._late += len(p.records)
                continue
            closed.append(self._close(step, p))
        return closed

    def _stray(self, step: int, p: _Pending) -> bool:
        """A step past a gap in the job's step numbers that fewer than half of its ranks
        reported: no step of the job (one forged record of a step far ahead). Closed, it
        made every later record of the real run late (the detection blind) until the run
        caught up with it; its records are late instead. A real step where ranks died
        follows the last closed one."""
        return (
            step > self.last_closed + 1
            and self.last_closed >= 0
            and 2 * len(p.ranks) < self.watch.expected()
        )

    def _close(self, step: int, p: _Pending) -> ClosedStep:
        self.last_closed = step
        if p.max_end > self.last_closed_end:
            self.last_closed_end = p.max_end
        out = build_step(step, self.world_size, p.records)
        self.watch.closed(step, out.present, out.m[END])
        if out.complete:
            self.absent.clear()
        else:
            self.absent = set(out.missing())
        return out


def build_step(step: int, world_size: int, records: list[StepRecord]) -> ClosedStep:
    """Scatter the records of one step into per-rank rows (one NumPy pass)."""
    n = len(records)
    a, rank_list, has_phases, has_extra, samples, tokens, flops, nonfinite = _columns(records)
    ranks = np.array(rank_list, np.intp)
    present = np.zeros(world_size, bool)
    present[ranks] = True
    rows = np.empty((ROWS, n))
    rows[START : END + 1] = a[0:2]
    rows[DUR] = a[1] - a[0]
    if has_phases:
        nan = np.isnan(a)
        a0 = np.where(nan, 0.0, a)  # unmeasured as 0 where a sum needs it (data, comm, pause)
        parts, parts_nan = a[3:6], nan[3:6]
        xfer: np.ndarray | float = 0.0
        evals: np.ndarray | float = 0.0
        rows[FWD : OPT + 1] = parts
        rows[EXTRA] = NAN
        if has_extra:
            other, xfer, evals = _split_extra(records)
            rows[EXTRA] = other
            parts = np.vstack([parts, other])
            parts_nan = np.isnan(parts)
        if parts_nan.any():
            measured = ~parts_nan.all(axis=0)
            rows[COMPUTE] = np.where(measured, np.nansum(parts, axis=0), NAN)
        else:
            rows[COMPUTE] = parts.sum(axis=0)
        rows[DATA] = a[2]
        rows[XFER] = xfer
        rows[COMM : CKPT + 1] = a[6:8]
        rows[PAUSE] = a0[7] + evals
        rows[BUSY] = rows[COMPUTE] + a0[2] + xfer
        rows[OTHER] = np.maximum(rows[DUR] - rows[BUSY] - a0[6] - rows[PAUSE], 0.0)
    else:
        rows[DATA:] = NAN
        rows[PAUSE] = 0.0
    rows[CPUW : CPUT + 1] = a[8:10]
    if n == world_size and (ranks == np.arange(n)).all():
        m = rows  # every rank, in rank order (records sent host by host): no scatter
    else:
        m = np.full((ROWS, world_size), NAN)
        m[:, ranks] = rows
    return ClosedStep(
        step=step,
        world_size=world_size,
        records=records,
        present=present,
        m=m,
        med=rowmed(rows),
        has_phases=has_phases,
        samples=samples,
        tokens=tokens,
        flops=flops,
        end_max=float(a[1].max()),
        start_min=float(a[0].min()),
        nonfinite_ranks=tuple(nonfinite),
    )


# The records' fields: (a row per time: start, end, data, forward, backward, optimizer,
# comm_wait, checkpoint, cpu_wait, cpu_time; ranks; has phases; has extra sections;
# samples; tokens; flops or None; ranks with a non-finite loss)
Columns = tuple[np.ndarray, list[int], bool, bool, int, int, float | None, list[int]]
_EXTRA = attrgetter("extra")


def _columns(records: list[StepRecord]) -> Columns:
    """The records' fields column by column: a comprehension per field and one flat
    conversion of the times (a checkpoint, mostly absent, apart). A record without
    phases reads as one whose phases are all unmeasured."""
    given = [r.phases for r in records]
    missing = given.count(None)
    phases = [_EMPTY_PHASES if p is None else p for p in given] if missing else given
    times = _time_rows(records, cast("list[Phases]", phases))
    ckpt = [p.checkpoint for p in cast("list[Phases]", phases)]
    a = np.empty((10, len(records)))
    a[0:7] = times[:, 0:7].T
    a[7] = NAN if ckpt.count(None) == len(ckpt) else np.array(ckpt, dtype=float)
    a[8:10] = times[:, 7:9].T
    flops_of = [r.flops for r in records]
    known = [f for f in flops_of if f is not None]
    flops = 0.0
    for f in known:  # summed in order
        flops += f
    return (
        a,
        [r.rank for r in records],
        missing < len(records),
        any(map(_EXTRA, phases)),
        sum([r.samples for r in records]),
        sum([r.tokens for r in records]),
        flops if known else None,
        [r.rank for r in records if r.loss_nonfinite],
    )


def _time_rows(records: list[StepRecord], phases: list[Phases]) -> np.ndarray:
    """Each record's start, end, data, forward, backward, optimizer, comm_wait,
    cpu_wait and cpu_time as a float64 row (None: NaN), packed record by record
    (``stepwatch.streams.core.packing``); with a None (CPU times a collector does not
    read, say), NumPy's conversion of the flat values (``np.fromiter``: None is NaN)."""
    if not records or _likely_absent(records[0], phases[0]):
        return _time_rows_absent(records, phases)  # no pack to raise and catch
    pack = layout(_TIMES).pack
    try:
        packed = b"".join(
            [
                pack(
                    r.start,
                    r.end,
                    p.data,
                    p.forward,
                    p.backward,
                    p.optimizer,
                    p.comm_wait,
                    r.cpu_wait,
                    r.cpu_time,
                )
                for r, p in zip(records, phases, strict=True)
            ]
        )
    except (struct.error, TypeError):  # unmeasured (None) on a later record
        return _time_rows_absent(records, phases)
    return np.frombuffer(packed).reshape(-1, len(_TIMES))


def _likely_absent(r: StepRecord, p: Phases) -> bool:
    """Whether the first record lacks a time that collectors often do not read."""
    return r.cpu_wait is None or r.cpu_time is None or p.comm_wait is None or p.data is None


def _time_rows_absent(records: list[StepRecord], phases: list[Phases]) -> np.ndarray:
    """:func:`_time_rows` when a time may be None: np.fromiter reads it as NaN. The
    fields are named again here (a tuple per record) because the fast path passes them
    as arguments; tests/unit/streams/core/test_assembly.py checks both paths."""
    rows = [
        (r.start, r.end, p.data, p.forward, p.backward, p.optimizer, p.comm_wait,
         r.cpu_wait, r.cpu_time)
        for r, p in zip(records, phases, strict=True)
    ]  # fmt: skip
    n = len(_TIMES)
    return np.fromiter(chain.from_iterable(rows), float, len(rows) * n).reshape(-1, n)


_TIMES = "d" * 9  # see _time_rows


PAUSE_SECTIONS = frozenset({"eval", "evaluation", "validation", "val"})


def _split_extra(records: list[StepRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Extra sections per rank as (other work, own transfers, evaluation pauses)."""
    n = len(records)
    other, xfer, evals = np.full(n, NAN), np.zeros(n), np.zeros(n)
    for i, r in enumerate(records):
        if r.phases is None or not r.phases.extra:
            continue
        for name, value in r.phases.extra.items():
            low = name.lower()
            if low in PAUSE_SECTIONS:
                evals[i] += value
            elif low.startswith(("comm", "nccl")) or "transfer" in low:
                xfer[i] += value
            else:
                other[i] = value if np.isnan(other[i]) else other[i] + value
    return other, xfer, evals
