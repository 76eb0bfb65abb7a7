"""From the training thread's marks to contract records (runs off the hot path).

A :class:`RawStep` holds ``perf_counter_ns`` marks (and CUDA events); the
:class:`Resolver` turns it into a :class:`Resolved` step (epoch start, duration,
phase offsets, all in ns) and then into a contract ``StepRecord``. With CUDA
events the durations come from ``elapsed_time`` between completed events
(``timing="cuda"``); otherwise from the marks (``timing="wall"``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepwatch.contract.records import STEP_COUNT_MAX, STEP_FLOPS_MAX, StepRecord
from stepwatch.logs import LogOnce
from stepwatch.sdk.cpuwait import seconds
from stepwatch.sdk.cuda import elapsed_ns
from stepwatch.sdk.identity import Identity
from stepwatch.sdk.phases import to_phases
from stepwatch.sdk.step import RawStep

logger = logging.getLogger(__name__)

REANCHOR_NS = 60 * 1_000_000_000  # re-read the wall clock against perf_counter every minute


@dataclass(frozen=True)
class Resolved:
    """One step with absolute start (epoch ns) and phase offsets from it (ns)."""

    identity: Identity
    number: int
    start_ns: int
    duration_ns: int
    spans: tuple[tuple[str, int, int], ...]
    timing: str
    samples: int
    tokens: int
    loss: float | None
    loss_nonfinite: bool
    flops: float | None
    cpu_time: float | None = None  # the training thread's time on a CPU over the step (s)
    cpu_wait: float | None = None  # ... and its run-queue wait (s)


class Resolver:
    """Converts raw steps; keeps the perf_counter -> epoch anchor fresh."""

    def __init__(
        self,
        wall_ns: Callable[[], int] = time.time_ns,
        perf_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._wall_ns = wall_ns
        self._perf_ns = perf_ns
        self._log = LogOnce(logger)
        self.extra_dropped = 0
        self._anchor_perf = 0
        self._anchor_wall = 0
        self._reanchor()

    def _reanchor(self) -> None:
        self._anchor_perf = self._perf_ns()
        self._anchor_wall = self._wall_ns()

    def epoch_ns(self, perf: int) -> int:
        """The epoch time (ns) of a perf_counter_ns mark."""
        if self._perf_ns() - self._anchor_perf > REANCHOR_NS:
            self._reanchor()
        return self._anchor_wall + (perf - self._anchor_perf)

    def resolve(self, raw: RawStep) -> Resolved:
        start = self.epoch_ns(raw.start_ns)
        try:
            cuda = _cuda_offsets(raw)
        except Exception as err:  # an event torch refuses to time: fall back to the marks
            self._log(
                "cuda_elapsed",
                "stepwatch sdk: CUDA elapsed_time failed err=%r; using wall time for the step",
                err,
            )
            cuda = None
        if cuda is not None:
            duration, spans = cuda
            timing = "cuda"
        else:
            duration = raw.end_ns - raw.start_ns
            spans = tuple((n, a - raw.start_ns, b - raw.start_ns) for n, a, b, _, _ in raw.spans)
            timing = "wall"
        loss, nonfinite = self._loss(raw.loss)
        cpu_time, cpu_wait = seconds(raw.cpu)
        return Resolved(
            identity=raw.identity,
            number=raw.number,
            start_ns=start,
            duration_ns=max(0, duration),
            spans=spans,
            timing=timing,
            samples=self._count("samples", raw.samples),
            tokens=self._count("tokens", raw.tokens),
            loss=loss,
            loss_nonfinite=nonfinite,
            flops=self._flops(raw.flops),
            cpu_time=cpu_time,
            cpu_wait=cpu_wait,
        )

    def to_record(self, step: Resolved) -> StepRecord:
        ident = step.identity
        phases, dropped = to_phases((n, max(0, b - a) / 1e9) for n, a, b in step.spans)
        if dropped:
            self.extra_dropped += dropped
            self._log(
                "extra",
                "stepwatch sdk: more than 32 extra phase names in one step; dropped=%s",
                dropped,
            )
        return StepRecord(
            job_id=ident.job_id,
            rank=ident.rank,
            world_size=ident.world_size,
            step=step.number,
            start=step.start_ns / 1e9,
            end=(step.start_ns + step.duration_ns) / 1e9,
            host=ident.host,
            local_rank=ident.local_rank,
            gpu=ident.gpu,
            group=ident.group,
            phases=phases if step.spans else None,
            samples=step.samples,
            tokens=step.tokens,
            loss=step.loss,
            loss_nonfinite=step.loss_nonfinite,
            flops=step.flops,
            timing=step.timing,
            cpu_time=step.cpu_time,
            cpu_wait=step.cpu_wait,
        )

    def _loss(self, value: Any) -> tuple[float | None, bool]:
        """A float loss, or (None, True) for NaN/inf: JSON cannot carry them."""
        number = self._number("loss", value, finite=False)
        if number is None:
            return None, False
        if not math.isfinite(number):
            return None, True
        return number, False

    def _number(self, name: str, value: Any, finite: bool = True) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)  # a 0-dim tensor converts here, off the training thread
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            self._log(
                f"bad_{name}",
                "stepwatch sdk: %s=%r is not a number err=%r; omitted",
                name,
                value,
                err,
            )
            return None
        if finite and not math.isfinite(number):
            self._log(
                f"nonfinite_{name}", "stepwatch sdk: %s=%r is not finite; omitted", name, number
            )
            return None
        return number

    def _count(self, name: str, value: Any) -> int:
        number = self._number(name, value)
        if number is None or not 0 <= number <= STEP_COUNT_MAX:
            if number is not None:  # the agent refuses a record with a count beyond it
                self._log(
                    f"bad_{name}",
                    "stepwatch sdk: %s=%r is negative or above 2^40 a step; reported as 0",
                    name,
                    value,
                )
            return 0
        return int(number)

    def _flops(self, value: Any) -> float | None:
        number = self._number("flops", value)
        if number is not None and not 0 <= number <= STEP_FLOPS_MAX:
            self._log(
                "bad_flops",
                "stepwatch sdk: flops=%r is negative or above 1e24 a step; omitted",
                value,
            )
            return None
        return number


def _cuda_offsets(raw: RawStep) -> tuple[int, tuple[tuple[str, int, int], ...]] | None:
    """Duration and phase offsets from CUDA events; None when any event is missing."""
    origin, last = raw.start_event, raw.end_event
    if origin is None or last is None:
        return None
    spans = []
    for name, _, _, first, end in raw.spans:
        if first is None or end is None:
            return None
        spans.append((name, elapsed_ns(origin, first), elapsed_ns(origin, end)))
    return elapsed_ns(origin, last), tuple(spans)
