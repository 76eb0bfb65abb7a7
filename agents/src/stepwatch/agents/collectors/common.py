"""Pieces every host collector shares: health bookkeeping and job attribution."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from stepwatch.agents.collectors.base import CollectorHealth, HealthState, HostContext
from stepwatch.logs import LogOnce


class HealthTracker:
    """Counts a collector's errors, logs each distinct problem once, and
    derives its :class:`CollectorHealth` from the last tick.

    Call :meth:`begin_tick` at the start of every ``collect``; then
    :meth:`error` for each field that failed (the tick turns DEGRADED) or
    :meth:`down` when the whole source is unavailable (the tick turns DOWN).
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log_once = LogOnce(logger)
        self.errors_total = 0
        self.last_error = ""
        self._by_reason: dict[str, int] = {}
        self._tick_errors = 0
        self._down = False

    def begin_tick(self) -> None:
        self._tick_errors = 0
        self._down = False

    def error(self, key: str, reason: str, msg: str, *args: object) -> None:
        """One field failed: count it under ``reason``, log once per ``key``."""
        self._count(reason)
        self._tick_errors += 1
        self.last_error = f"{reason}: {key}"
        self._log_once(f"{key}|{reason}", msg, *args)

    def down(self, key: str, reason: str, msg: str, *args: object) -> None:
        """The whole source is unavailable this tick."""
        self._count(reason)
        self._down = True
        self.last_error = f"{reason}: {key}"
        self._log_once(f"{key}|{reason}", msg, *args)

    def still_down(self) -> None:
        """The source is still unavailable (already counted and logged)."""
        self._down = True

    def note(self, key: str, msg: str, *args: object, level: int = logging.INFO) -> None:
        """Log a notable condition once without counting it as an error."""
        self._log_once(key, msg, *args, level=level)

    @property
    def tick_errors(self) -> int:
        return self._tick_errors

    def error_counts(self) -> dict[str, int]:
        """Errors since start, by reason (for the agent's metrics)."""
        return dict(self._by_reason)

    def health(self) -> CollectorHealth:
        if self._down:
            state = HealthState.DOWN
        elif self._tick_errors:
            state = HealthState.DEGRADED
        else:
            state = HealthState.OK
        return CollectorHealth(state, self.errors_total, self.last_error)

    def _count(self, reason: str) -> None:
        self.errors_total += 1
        self._by_reason[reason] = self._by_reason.get(reason, 0) + 1


class TrackedCollector:
    """The health accounting every host collector shares (NVML, dcgm, RDMA).

    A subclass sets ``self._health = HealthTracker(log)`` in its ``__init__`` and
    reports through it in ``collect``; :meth:`health` and :meth:`error_counts`
    (the :class:`~stepwatch.agents.collectors.base.Collector` interface and the
    agent's metrics) read it back.
    """

    _health: HealthTracker

    def health(self) -> CollectorHealth:
        return self._health.health()

    def error_counts(self) -> dict[str, int]:
        """Errors since start, by reason (for the agent's metrics)."""
        return self._health.error_counts()


def job_for(ctx: HostContext, gpu_indices: Iterable[int]) -> str | None:
    """The job id when every listed GPU maps to one and the same job, else None."""
    jobs = {ctx.job_of_gpu.get(index) for index in gpu_indices}
    if len(jobs) == 1:
        return jobs.pop()
    return None
