"""The interface between the detection core and whatever drives it.

The Faust workers (``stepwatch.streams.worker.app``) and the offline replay
(``stepwatch.streams.replay``) both drive an :class:`Analyzer`: feed it every
valid telemetry message of the jobs they own, call :meth:`Analyzer.tick`
regularly, publish what comes back. The core is pure Python/NumPy: no Kafka,
no Faust, no Prometheus in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from stepwatch.contract import DetectionMessage, Message


@dataclass(frozen=True)
class JobStats:
    """Per-job aggregates for metrics (bounded cardinality: one per job)."""

    job_id: str
    last_step: int
    world_size: int
    step_seconds_median: float | None  # median wall time of the recent steps (contract.goodput)
    samples_per_second: float | None
    tokens_per_second: float | None
    mfu: float | None
    goodput_ratio: float | None
    hung: bool
    open_detections: int
    flagged_ranks: dict[int, float] = field(default_factory=dict)  # rank -> straggler score
    # badput category (stepwatch.contract.goodput.Badput) -> seconds
    badput_seconds: dict[str, float] = field(default_factory=dict)
    step_seconds_baseline: float | None = None  # the straggler-free baseline, None until known
    mfu_note: str = ""  # why mfu is None (contract.goodput.MFU_UNKNOWN); empty when it is known
    # straggler *suspects*: slower than their peers, but not (yet) material or lasting enough
    # to be an incident (see docs/detection.md, "Two tiers"): rank -> score now, and how many
    # ranks became suspects since the job started
    suspect_ranks: dict[int, float] = field(default_factory=dict)
    suspects_total: int = 0


class Analyzer(Protocol):
    def process(self, message: Message, arrived: float | None = None) -> list[DetectionMessage]:
        """Feed one valid message (any kind) that came at ``arrived`` on the driver's
        clock (the clock ``tick`` is given; None: event time, the message's ``ts``);
        return detection state changes."""
        ...

    def tick(self, now: float) -> list[DetectionMessage]:
        """Time passes: close step windows past their deadline, check for hangs."""
        ...

    def forget(self, job_id: str, now: float, why: str) -> list[DetectionMessage]:
        """Drop a job's state now (the driver's admission let it go to make room);
        return its open detections, resolved."""
        ...

    def forget_host(self, host: str) -> None:
        """Drop a host's samples and events now (the driver's admission let it go)."""
        ...

    def stats(self) -> list[JobStats]: ...
