"""Throughput, MFU and goodput of one job.

samples/s and tokens/s are the sums over ranks of the last ``throughput_steps``
closed steps divided by the time those steps took (latest end to latest end).
MFU is the FLOPs the ranks report divided by (step period x the sum of the
ranks' peak dense BF16 FLOP/s), the peak looked up from the GPU's model name.

Step time, goodput and badput are defined once, in :mod:`stepwatch.contract.goodput`
(the report uses the same functions): the step time is the median wall time of
the recent steps (each step: the median over its ranks); of the job's wall time
since it started, *productive* time is the step time spent working at the
straggler-free baseline pace; *badput* is data loading, checkpointing, time
above the straggler-free baseline (``straggler``), hang time, restart time (from
the last progress before a restart to the first step after it), wasted progress
(steps recomputed after a restart, at the job's step time) and ``other``
(start-up, evaluation pauses, gaps between steps).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stepwatch.contract.goodput import Badput, split_step
from stepwatch.streams.core.assembly import CKPT, DATA, DUR, END, PAUSE, START, ClosedStep, Rewind
from stepwatch.streams.core.ring import Ring

BADPUT = tuple(b.value for b in Badput)
MAX_START_HOSTS = 8  # hosts whose job_start events are kept (rank 0's, normally one)
Baseline = tuple[float, float]  # straggler-free step time and its data phase (seconds)


class Throughput:
    def __init__(self, steps: int) -> None:
        self.window = Ring(steps, 4)  # end_max, samples, tokens, flops
        self.durations = Ring(steps, 1)  # the median rank's step wall time
        # the job's wall time is counted on the median rank's clock (first start to last
        # end), plus the time since the last end on the clock of the host most ahead (the
        # clock ``goodput``'s ``now`` is on, see Job.local): a host whose clock is off
        # from its peers' adds nothing to it
        self.first_start: float | None = None  # the median rank's first step start
        # job_start events: host -> the earliest, on that host's clock, until the host's
        # offset is known (``settle``); then the earliest of them on the median rank's clock
        self.start_events: dict[str, float] = {}
        self.settled_start: float | None = None
        self.last_end_med = 0.0
        self.last_end = 0.0
        self.productive = 0.0
        self.badput = dict.fromkeys(BADPUT, 0.0)
        self.peak_flops_total: float | None = None  # sum over ranks, set by the job
        self.step_seconds: float | None = None
        self._skip = 0  # steps after a restart left out of the step time (warm-up)

    def on_start(self, ts: float) -> None:
        if self.first_start is None or ts < self.first_start:
            self.first_start = ts

    def on_job_start(self, host: str, ts: float) -> None:
        """A ``job_start`` event stamped ``ts`` by ``host`` (start-up before the first step
        counts as wall time)."""
        known = self.start_events.get(host)
        if known is not None or len(self.start_events) < MAX_START_HOSTS:
            self.start_events[host] = ts if known is None else min(known, ts)

    def settle(self, clock: Callable[[str, float], float], knows: Callable[[str], bool]) -> None:
        """Read the job_start events of the hosts whose offsets ``knows`` on the median
        rank's clock for good (a later placement, after a requeue, forgets the offsets)."""
        for host in [h for h in self.start_events if knows(h)]:
            t = clock(host, self.start_events.pop(host))
            if self.settled_start is None or t < self.settled_start:
                self.settled_start = t

    def _first(
        self,
        clock: Callable[[str, float], float],
        member: Callable[[str], bool] = lambda host: True,
    ) -> float | None:
        starts = [clock(h, t) for h, t in self.start_events.items() if member(h)]
        for t in (self.first_start, self.settled_start):
            if t is not None:
                starts.append(t)
        return min(starts, default=None)

    def on_step(self, cs: ClosedStep, baseline: Baseline | None = None) -> None:
        """Account one closed step; ``baseline``: the straggler-free step time, if known."""
        start, end = float(cs.med[START]), float(cs.med[END])
        self.on_start(start if start == start else cs.start_min)
        if end == end and end > self.last_end_med:
            self.last_end_med = end
        self.last_end = max(self.last_end, cs.end_max)
        flops = np.nan if cs.flops is None else cs.flops
        self.window.push(np.array([cs.end_max, cs.samples, cs.tokens, flops]))
        m = cs.med
        dur = float(m[DUR])
        if dur != dur:
            return
        split = split_step(
            dur, _num(m[DATA]), _num(m[CKPT]), _num(m[PAUSE]), *(baseline or (None, 0.0))
        )
        self.productive += split.productive
        self.badput[Badput.DATA_LOADING] += split.data_loading
        self.badput[Badput.CHECKPOINT] += split.checkpoint
        self.badput[Badput.STRAGGLER] += split.straggler
        self.step_seconds = dur
        if self._skip > 0:  # a restart's warm-up: not the job's step time
            self._skip -= 1
            return
        self.durations.push(dur)

    def step_median(self) -> float | None:
        """The job's step time: median wall time of the recent steps (median rank each)."""
        rows = self.durations.filled()
        return float(np.median(rows[:, 0])) if len(rows) else None

    def on_rewind(self, rw: Rewind, step_seconds: float | None, warmup: int = 0) -> None:
        """A restart: its gap and the progress it redoes are badput; the step time starts
        over with the new run, after its ``warmup`` steps (the old run's steps, a
        straggler's included, are not the new run's step time: a remediation's outcome
        reads it)."""
        self.durations.clear()
        self._skip = warmup
        self.badput[Badput.RESTART] += max(0.0, rw.gap_seconds)
        lost = max(0, rw.from_step - rw.to_step + 1) * (step_seconds or 0.0)
        lost = min(lost, self.productive)
        self.badput[Badput.WASTED_PROGRESS] += lost
        self.productive -= lost

    def on_hang_end(self, seconds: float) -> None:
        self.badput[Badput.HANG] += max(0.0, seconds)

    def _span(self) -> tuple[np.ndarray, float] | None:
        rows = self.window.filled()
        if len(rows) < 2:
            return None
        order = np.argsort(rows[:, 0])
        rows = rows[order]
        span = float(rows[-1, 0] - rows[0, 0])
        return (rows[1:], span) if span > 0 else None

    def samples_per_second(self) -> float | None:
        got = self._span()
        return None if got is None else float(got[0][:, 1].sum()) / got[1]

    def tokens_per_second(self) -> float | None:
        got = self._span()
        return None if got is None else float(got[0][:, 2].sum()) / got[1]

    def mfu(self) -> float | None:
        got = self._span()
        if got is None or not self.peak_flops_total:
            return None
        flops = got[0][:, 3]
        if np.isnan(flops).any():
            return None
        return float(flops.sum()) / got[1] / self.peak_flops_total

    def goodput(
        self,
        now: float,
        hang_seconds: float = 0.0,
        clock: Callable[[str, float], float] = lambda host, t: t,
        member: Callable[[str], bool] = lambda host: True,
    ) -> tuple[float | None, dict[str, float]]:
        """Goodput ratio and badput seconds by category, at event time ``now``; ``clock``
        reads a host's time on the median rank's clock (its ``job_start``); ``member``:
        whether a host runs the job's ranks (a ``job_start`` from any other host, sent
        before the job was known, does not count)."""
        first = self._first(clock, member)
        if first is None:
            return None, dict(self.badput)
        since = max(0.0, now - self.last_end)  # no step since (a hang, the job's end)
        wall = max(self.last_end_med, first) - first + since
        if wall <= 0:
            return None, dict(self.badput)
        bad = dict(self.badput)
        bad[Badput.HANG] += hang_seconds
        known = self.productive + sum(bad.values())
        bad[Badput.OTHER] = max(0.0, wall - known)
        ratio = min(1.0, max(0.0, self.productive / wall))
        return ratio, {k: round(v, 3) for k, v in bad.items()}


def _num(value: float) -> float:
    return 0.0 if np.isnan(value) else float(value)
