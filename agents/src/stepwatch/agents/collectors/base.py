"""The collector interface: one small pluggable source of host telemetry.

A collector is polled once per tick by the agent and returns contract messages
(usually one GpuMessage or PortMessage for the whole host, plus EventMessages
for discrete events seen since the last poll). It never raises into the agent:
problems are recorded in its :class:`CollectorHealth` and logged once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stepwatch.contract import Message


class HealthState(enum.StrEnum):
    OK = "ok"
    DEGRADED = "degraded"  # some readings failed, the rest came through
    DOWN = "down"  # the source is unavailable (NVML missing, endpoint down, no sysfs tree)


@dataclass(frozen=True)
class CollectorHealth:
    state: HealthState
    errors_total: int = 0
    last_error: str = ""


@dataclass(frozen=True)
class HostContext:
    """What the agent knows about the host when it polls: its name, the clock,
    and which job/rank each local GPU belongs to (learned from step events)."""

    host: str
    now: float
    job_of_gpu: dict[int, str]


@runtime_checkable
class Collector(Protocol):
    name: str

    def collect(self, ctx: HostContext) -> list[Message]:
        """Read the source once. Never raises; see :meth:`health`."""
        ...

    def health(self) -> CollectorHealth: ...

    def close(self) -> None: ...
