"""What the job numbers mean: step time, goodput and badput, MFU. One definition for all.

The stream worker's job metrics (``stepwatch_job_*``), the replay summary, the
post-mortem report and the dashboards' queries all use these words and these
functions, so that the same run gives the same numbers wherever it is read.

**Step time** is the median wall time of the job's steps: for each step the
median over its ranks, then the median over the recent steps (the worker: the
last ``throughput_steps``; the report: the whole run, and per step over time).
Synchronous training makes every rank's step as slow as the slowest rank: the
step time includes the time everyone waits for a straggler.

**Straggler-free baseline** is what a step takes without that wait: the
detection core's own baseline (the job's step time over the steps no slowdown
was flagged in). It is shown under its own name (``stepwatch_job_step_baseline_seconds``),
never as "step time".

**Goodput** is the share of the job's wall time (first step start to now or the
last step end) spent in productive step time; **badput** is the rest, by
category, after Google's ml-goodput-measurement (``BadputType``: data loading,
checkpoint save/restore, wasted progress from disruption, ..., other), plus
the one that matters most here, the straggler:

========================  ====================================================
``data_loading``          the data phase of steps (Google: DATA_LOADING_SYNC)
``checkpoint``            checkpoint save and restore phases
``straggler``             step time above the straggler-free baseline, not
                          explained by data loading: everyone waiting for a
                          slow rank, GPU, host or link
``hang``                  time with no progress (a hang detection)
``restart``               from the last progress before a restart to the first
                          step after it (recovery after a disruption)
``wasted_progress``       steps run again after a restart from a checkpoint
                          (Google: WASTED_PROGRESS_FROM_DISRUPTION)
``other``                 the rest: start-up, evaluation pauses, gaps between steps
========================  ====================================================

**MFU** (model FLOPs utilisation) is the model FLOPs the ranks report per step
(``StepRecord.flops``) over the step period times the sum of the ranks' peak
FLOP/s; with either unknown it is absent and :data:`MFU_UNKNOWN` says why.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable
from dataclasses import dataclass


class Badput(enum.StrEnum):
    DATA_LOADING = "data_loading"
    CHECKPOINT = "checkpoint"
    STRAGGLER = "straggler"
    HANG = "hang"
    RESTART = "restart"
    WASTED_PROGRESS = "wasted_progress"
    OTHER = "other"


PRODUCTIVE = "productive"

LABELS: dict[str, str] = {
    PRODUCTIVE: "productive (goodput)",
    Badput.DATA_LOADING: "data loading",
    Badput.CHECKPOINT: "checkpoint save/restore",
    Badput.STRAGGLER: "waiting for a straggler (above the straggler-free baseline)",
    Badput.HANG: "hang (no progress)",
    Badput.RESTART: "restart / recovery after a disruption",
    Badput.WASTED_PROGRESS: "wasted progress (steps run again)",
    Badput.OTHER: "other (start-up, evaluation, gaps)",
}

# A step counts as slowed by a straggler when it is more than this share above the
# straggler-free baseline: below it is the ordinary wait for the slowest rank's jitter
# (the detector's own job-slowdown floor, DetectConfig.slowdown_min_excess).
STRAGGLER_TOLERANCE = 0.05
# Steps of a job before its straggler-free baseline exists (the detector's warm-up, 5,
# plus its min_baseline_steps, 20): a slow step then is warm-up, not a straggler.
BASELINE_AFTER_STEPS = 25

MFU_UNKNOWN = (
    "MFU needs flops_per_step and peak_flops: set the step's flops in the SDK "
    "(step.flops = model FLOPs of this rank's step, docs/sdk.md) and run on a GPU "
    "model the detection config knows (DetectConfig.gpu_peak_flops)"
)


@dataclass(frozen=True)
class StepSplit:
    """One step's median-rank wall time, split into the categories (seconds)."""

    productive: float
    data_loading: float
    checkpoint: float
    straggler: float
    pause: float  # evaluation and other pauses inside the step: "other"


def split_step(
    step_s: float,
    data_s: float,
    checkpoint_s: float,
    pause_s: float,
    baseline_s: float | None,
    baseline_data_s: float = 0.0,
    tolerance: float = STRAGGLER_TOLERANCE,
) -> StepSplit:
    """Split one step's time; ``baseline_s`` is the straggler-free step time (None: unknown).

    The straggler share is the step time above the baseline (checkpoint and evaluation
    pauses aside: the baseline holds none) less what the data phase grew by over the
    baseline's (that is data loading), at most the step's non-data, non-pause time;
    nothing while the excess is within ``tolerance`` of the baseline (jitter).
    """
    data = min(max(data_s, 0.0), step_s)
    ckpt = min(max(checkpoint_s, 0.0), step_s - data)
    pause = max(ckpt, min(max(pause_s, 0.0), step_s - data))  # checkpoint + evaluation
    work = step_s - data - pause
    straggler = 0.0
    if baseline_s is not None and baseline_s > 0:
        excess = step_s - pause - baseline_s - max(0.0, data - baseline_data_s)
        if excess > tolerance * baseline_s:
            straggler = min(excess, max(work, 0.0))
    return StepSplit(max(work - straggler, 0.0), data, ckpt, straggler, pause - ckpt)


def step_time(step_medians: Iterable[float]) -> float | None:
    """The job's step time: the median over steps of each step's median over ranks."""
    values = [v for v in step_medians if v == v]
    return statistics.median(values) if values else None
