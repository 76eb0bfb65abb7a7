"""Goodput and badput of one job, after Google's ml-goodput-measurement.

Rank-seconds available (world size x the job's wall time, first step start to
last step end) are split into:

* ``productive``: step time that advanced training (step time minus the data
  and checkpoint phases, steps not run again later);
* ``data_loading``: the data phase of steps;
* ``checkpoint``: the checkpoint phase (saves) and restores;
* ``disruption``: wasted progress and recovery after a disruption: steps run
  again after a restart, and gaps between steps longer than
  ``GAP_FACTOR`` x the median step (hang, crash, restart);
* ``other``: what is left (short gaps between steps, startup, stragglers'
  idle wait not inside a step).
"""

from __future__ import annotations

import enum
import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GAP_FACTOR = 3.0


class Badput(enum.StrEnum):
    PRODUCTIVE = "productive"
    DATA_LOADING = "data_loading"
    CHECKPOINT = "checkpoint"
    DISRUPTION = "disruption"
    OTHER = "other"


LABELS = {
    Badput.PRODUCTIVE: "productive (goodput)",
    Badput.DATA_LOADING: "data loading",
    Badput.CHECKPOINT: "checkpoint save/restore",
    Badput.DISRUPTION: "wasted progress + recovery after disruption",
    Badput.OTHER: "other",
}


@dataclass(frozen=True)
class Breakdown:
    available_s: float
    seconds: Mapping[Badput, float]

    @property
    def goodput(self) -> float:
        return self.seconds[Badput.PRODUCTIVE] / self.available_s if self.available_s else 0.0

    def fraction(self, kind: Badput) -> float:
        return self.seconds[kind] / self.available_s if self.available_s else 0.0


def breakdown(steps: Sequence[Mapping[str, Any]]) -> Breakdown:
    """The split of one job's rank-seconds; ``steps`` is one row per step (report.data.STEPS)."""
    zero = {k: 0.0 for k in Badput}
    if not steps:
        return Breakdown(0.0, zero)
    world = max(int(s["world"]) for s in steps)
    first = min(float(s["start"]) for s in steps)
    last = max(float(s["end"]) for s in steps)
    available = world * max(last - first, 0.0)
    rank_s = sum(float(s["rank_s"]) for s in steps)
    data = sum(float(s["data_s"]) for s in steps)
    ckpt = sum(float(s["checkpoint_s"]) for s in steps)
    rerun = sum(float(s["rank_s"]) * (1 - int(s["ranks"]) / int(s["rows"]))
                for s in steps if int(s["rows"]) > int(s["ranks"]))
    long_gaps, short_gaps = _gaps(steps)
    out = dict(zero)
    out[Badput.DATA_LOADING] = data
    out[Badput.CHECKPOINT] = ckpt
    out[Badput.DISRUPTION] = rerun + world * long_gaps
    out[Badput.PRODUCTIVE] = max(rank_s - data - ckpt - rerun, 0.0)
    out[Badput.OTHER] = max(available - sum(out.values()), 0.0) if available else world * short_gaps
    return Breakdown(available, out)


def _gaps(steps: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """Seconds between consecutive steps: (gaps that mean a disruption, ordinary gaps)."""
    ordered = sorted(steps, key=lambda s: float(s["start"]))
    median = statistics.median(float(s["step_s"]) for s in ordered)
    long_gaps = short_gaps = 0.0
    for prev, cur in itertools.pairwise(ordered):
        gap = float(cur["start"]) - float(prev["end"])
        if gap <= 0:
            continue
        if gap > GAP_FACTOR * median:
            long_gaps += gap
        else:
            short_gaps += gap
    return long_gaps, short_gaps
