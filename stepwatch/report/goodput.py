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
* steps run again (more rows than ranks) are **wasted progress**;
* a gap between steps longer than ``GAP_FACTOR`` x the step time is a **restart**
  when the step numbers went back after it, else a **hang**;
* the rest (short gaps, start-up, evaluation pauses) is **other**.
"""

from __future__ import annotations

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
OPEN_END = 1 << 62
CATEGORIES: tuple[str, ...] = (PRODUCTIVE, *(b.value for b in Badput))

__all__ = ["CATEGORIES", "LABELS", "Breakdown", "baseline", "breakdown", "slowed_steps"]


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
    steps: Sequence[Mapping[str, Any]], detections: Iterable[Mapping[str, Any]] = ()
) -> Breakdown:
    """The split of one job's rank-seconds; ``steps``: one row per step (report.data.STEPS)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    if not steps:
        return Breakdown(0.0, out)
    world = max(int(s["world"]) for s in steps)
    available = world * max(
        max(float(s["end"]) for s in steps) - min(float(s["start"]) for s in steps), 0.0
    )
    detections = list(detections)
    base, base_data = baseline(steps, detections)
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
        if int(s["rows"]) > int(s["ranks"]):  # the step ran more than once: one run was wasted
            wasted = float(s["rank_s"]) * (1 - int(s["ranks"]) / int(s["rows"]))
            out[Badput.WASTED_PROGRESS] += wasted
            out[PRODUCTIVE] = max(out[PRODUCTIVE] - wasted, 0.0)
    median = step_time(float(s["step_s"]) for s in steps) or 0.0
    hang, restart = _gaps(steps, median)
    out[Badput.HANG] += world * hang
    out[Badput.RESTART] += world * restart
    out[Badput.OTHER] = max(available - sum(out.values()), 0.0)
    return Breakdown(available, out, median or None, base)


def _gaps(steps: Sequence[Mapping[str, Any]], median: float) -> tuple[float, float]:
    """Seconds of long gaps between consecutive steps: (hangs, restarts)."""
    ordered = sorted(steps, key=lambda s: float(s["start"]))
    hang = restart = 0.0
    for prev, cur in itertools.pairwise(ordered):
        gap = float(cur["start"]) - float(prev["end"])
        if gap > GAP_FACTOR * median:
            if int(cur["step"]) <= int(prev["step"]) or int(cur["rows"]) > int(cur["ranks"]):
                restart += gap
            else:
                hang += gap
    return hang, restart


def _f(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name)
    return 0.0 if value is None or value != value else float(value)
