"""Goodput and badput of one job from the store, with the worker's definitions.

The categories and the per-step split are :mod:`stepwatch.contract.goodput`'s
(the stream worker's ``stepwatch_job_badput_seconds`` uses the same): each
step's median-rank time is split into productive, data loading, checkpoint and
straggler time (above the straggler-free baseline), times the world size
(rank-seconds). Over the job's wall time (first step start to last step end):

* the **straggler-free baseline** is the detector's: each step's time less the
  wait a straggler adds (the median rank's collective wait over the least any
  rank had: the slow rank waits least) and less its checkpoint, then the median
  over the steps after the first ``WARMUP`` that no job-slowdown detection
  covered (and, for steps without phase timings, no straggler detection); its
  data phase likewise;
* the first ``BASELINE_AFTER_STEPS`` steps count no straggler time (the worker
  has no baseline yet either: a slow step then is warm-up);
* each run of the job (the first, then one per restart or requeue: report.data's
  ``run``) has its own steps: a step that a later run ran again is **wasted
  progress** (its productive time was redone; so are extra rows of a step within
  one run, more rows than ranks);
* the gap between two runs is a **restart**, whatever its length; any other gap
  between steps longer than ``GAP_FACTOR`` x the step time is a **restart** too
  when the job's hosts changed across it (a requeue that resumed right after its
  checkpoint) or a ``restart`` or ``job_start`` event lies in it, else a **hang**;
* ``checkpoint_save`` and ``checkpoint_load`` events outside every step (a
  checkpoint written between steps: its duration, from its start) are
  **checkpoint** time; inside a step the step's checkpoint phase already holds it.
  That time is taken out of the gap it lies in, so it is not a hang or a restart too;
* the rest (short gaps, start-up, evaluation pauses) is **other**.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepwatch.contract.goodput import (
    BASELINE_AFTER_STEPS,
    LABELS,
    PRODUCTIVE,
    Badput,
    split_step,
    step_time,
)

GAP_FACTOR = 3.0
WARMUP = 5  # first steps: not part of the baseline (the worker's warmup_steps)
SLOW_TYPES = ("straggler", "job_slowdown")
CHECKPOINT_EVENTS = ("checkpoint_save", "checkpoint_load")
RESTART_EVENTS = ("restart", "job_start")
OPEN_END = 1 << 62
CATEGORIES: tuple[str, ...] = (PRODUCTIVE, *(b.value for b in Badput))

__all__ = [
    "CATEGORIES",
    "LABELS",
    "Breakdown",
    "Gap",
    "baseline",
    "breakdown",
    "checkpoint_spans",
    "gaps",
    "slowed_steps",
]

Span = tuple[float, float]  # (start, end) in epoch seconds


@dataclass(frozen=True)
class Gap:
    """Time between two steps of the job with no step running."""

    start: float
    end: float
    restart: bool  # else a hang

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)


@dataclass(frozen=True)
class Breakdown:
    available_s: float  # rank-seconds
    seconds: Mapping[str, float]  # category (CATEGORIES) -> rank-seconds
    step_s: float | None = None  # the job's step time (median of the steps)
    baseline_s: float | None = None  # straggler-free baseline step time

    @property
    def goodput(self) -> float:
        return self.seconds[PRODUCTIVE] / self.available_s if self.available_s else 0.0

    def fraction(self, kind: str) -> float:
        return self.seconds[kind] / self.available_s if self.available_s else 0.0


def slowed_steps(detections: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """Step ranges covered by straggler and job-slowdown detections (onset to resolution;
    one still open at its last change covers the rest of the run)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for d in detections:
        if d.get("type") not in SLOW_TYPES or d.get("step") is None:
            continue
        key, step = str(d["id"]), int(d["step"])
        onset = int(d["first_step"]) if d.get("first_step") is not None else step
        first[key] = min(first.get(key, onset), onset)
        last[key] = step if d["state"] == "resolved" else OPEN_END
    return [(first[k], last[k]) for k in first]


def baseline(
    steps: Sequence[Mapping[str, Any]], detections: Iterable[Mapping[str, Any]] = ()
) -> tuple[float | None, float]:
    """(straggler-free step time, its data phase) over the steps no slowdown covered."""
    whole = slowed_steps(d for d in detections if d.get("type") == "job_slowdown")
    any_slow = slowed_steps(detections)
    clean = [
        s
        for s in steps[WARMUP:]
        if not _covered(s, whole)
        and (s.get("wait_excess") is not None or not _covered(s, any_slow))
    ]
    if not clean:
        return None, 0.0
    base = statistics.median(
        float(s["step_s"]) - _f(s, "wait_excess") - _f(s, "ckpt_med") for s in clean
    )
    return base, statistics.median(_f(s, "data_med") for s in clean)


def _covered(step: Mapping[str, Any], spans: Sequence[tuple[int, int]]) -> bool:
    return any(a <= int(step["step"]) <= b for a, b in spans)


def breakdown(
    steps: Sequence[Mapping[str, Any]],
    detections: Iterable[Mapping[str, Any]] = (),
    events: Iterable[Mapping[str, Any]] = (),
) -> Breakdown:
    """The split of one job's rank-seconds; ``steps``: one row per step of each run
    (report.data.STEPS), in run and step order; ``events``: report.data.EVENTS."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    if not steps:
        return Breakdown(0.0, out)
    world = max(int(s["world"]) for s in steps)
    available = world * max(
        max(float(s["end"]) for s in steps) - min(float(s["start"]) for s in steps), 0.0
    )
    base, base_data = baseline(steps, list(detections))
    _add_steps(out, steps, world, base, base_data)
    median = step_time(float(s["step_s"]) for s in steps) or 0.0
    _add_between_steps(out, steps, world, median, list(events))
    out[Badput.OTHER] = max(available - sum(out.values()), 0.0)
    return Breakdown(available, out, median or None, base)


def _add_steps(
    out: dict[str, float],
    steps: Sequence[Mapping[str, Any]],
    world: int,
    base: float | None,
    base_data: float,
) -> None:
    """Each step's split (contract.goodput.split_step), in rank-seconds; the productive
    time of a step run again later is wasted progress."""
    redone = _redone(steps)
    for i, s in enumerate(steps):  # before the baseline exists (warm-up) no step is a straggler's
        part = split_step(
            float(s["step_s"]),
            _f(s, "data_med"),
            _f(s, "ckpt_med"),
            0.0,
            base if i >= BASELINE_AFTER_STEPS else None,
            base_data,
        )
        out[PRODUCTIVE] += world * part.productive
        out[Badput.DATA_LOADING] += world * part.data_loading
        out[Badput.CHECKPOINT] += world * part.checkpoint
        out[Badput.STRAGGLER] += world * part.straggler
        wasted = world * part.productive if i in redone else _extra_rows(s)
        out[Badput.WASTED_PROGRESS] += wasted
        out[PRODUCTIVE] = max(out[PRODUCTIVE] - wasted, 0.0)


def _add_between_steps(
    out: dict[str, float],
    steps: Sequence[Mapping[str, Any]],
    world: int,
    median: float,
    events: Sequence[Mapping[str, Any]],
) -> None:
    """Checkpoints written between steps, then the gaps (hang, restart) less them."""
    outside = checkpoint_spans(events, steps)
    out[Badput.CHECKPOINT] += world * sum(b - a for a, b in outside)
    restarts = [float(e["ts"]) for e in events if e.get("type") in RESTART_EVENTS]
    for gap in gaps(steps, median, restarts):
        idle = max(gap.seconds - _overlap((gap.start, gap.end), outside), 0.0)
        out[Badput.RESTART if gap.restart else Badput.HANG] += world * idle


def _redone(steps: Sequence[Mapping[str, Any]]) -> set[int]:
    """Indexes of the steps a later run ran again (restarted from an earlier checkpoint)."""
    last_run: dict[int, int] = {}
    for s in steps:
        step = int(s["step"])
        last_run[step] = max(last_run.get(step, 0), _run(s))
    return {i for i, s in enumerate(steps) if _run(s) < last_run[int(s["step"])]}


def _extra_rows(step: Mapping[str, Any]) -> float:
    """Rank-seconds of a step's rows beyond one per rank (the step ran more than once
    within what the store tells apart as one run: one run was wasted)."""
    rows, ranks = int(step["rows"]), int(step["ranks"])
    return float(step["rank_s"]) * (1 - ranks / rows) if rows > ranks else 0.0


def gaps(
    steps: Sequence[Mapping[str, Any]], median: float, restarts: Iterable[float] = ()
) -> list[Gap]:
    """The gaps between consecutive steps that are not "other": every gap between two
    runs, and the longer than ``GAP_FACTOR`` x ``median`` ones; ``restarts``: times of
    restart and job start events."""
    ordered = sorted(steps, key=lambda s: float(s["start"]))
    marks = sorted(restarts)
    out: list[Gap] = []
    for prev, cur in itertools.pairwise(ordered):
        start, end = float(prev["end"]), float(cur["start"])
        new_run = _run(cur) != _run(prev)
        if not new_run and end - start <= GAP_FACTOR * median:
            continue
        restart = (
            new_run
            or int(cur["step"]) <= int(prev["step"])
            or int(cur["rows"]) > int(cur["ranks"])
            or cur.get("hosts", "") != prev.get("hosts", "")
            or bisect.bisect_right(marks, end) > bisect.bisect_left(marks, start)
        )
        out.append(Gap(start, end, restart))
    return out


def checkpoint_spans(
    events: Iterable[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
) -> list[Span]:
    """The parts of checkpoint save and load events that lie between the job's steps
    (outside every step, within the job's wall time), merged."""
    covered = _merged((float(s["start"]), float(s["end"])) for s in steps)
    if not covered:
        return []
    first, last = covered[0][0], covered[-1][1]
    saves = _merged(_event_span(e) for e in events if e.get("type") in CHECKPOINT_EVENTS)
    clipped = [(max(a, first), min(b, last)) for a, b in saves]
    return [piece for span in clipped if span[1] > span[0] for piece in _minus(span, covered)]


def _event_span(event: Mapping[str, Any]) -> Span:
    seconds = max(_f(event, "duration_s"), 0.0)
    started = event.get("started")
    start = float(started) if started is not None else float(event["ts"]) - seconds
    return start, start + seconds


def _merged(spans: Iterable[Span]) -> list[Span]:
    """Non-empty spans sorted and joined where they overlap."""
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(span: Span, covered: Sequence[Span]) -> list[Span]:
    """The parts of ``span`` outside the merged spans ``covered``."""
    a, b = span
    out: list[Span] = []
    for c, d in covered[max(bisect.bisect_left(covered, (a,)) - 1, 0) :]:
        if c >= b:
            break
        if c > a:
            out.append((a, c))
        a = max(a, d)
    if a < b:
        out.append((a, b))
    return out


def _overlap(span: Span, pieces: Sequence[Span]) -> float:
    a, b = span
    return sum(max(min(b, d) - max(a, c), 0.0) for c, d in pieces)


def _run(step: Mapping[str, Any]) -> int:
    return int(step.get("run") or 0)


def _f(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name)
    return 0.0 if value is None or value != value else float(value)
