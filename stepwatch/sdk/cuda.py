"""CUDA-event timing, optional: torch is never imported by stepwatch itself.

CPU wall time of an asynchronous kernel launch measures nothing, so when the
training script runs on CUDA each mark also records a CUDA event
(``torch.cuda.Event(enable_timing=True)``) on the current stream. Recording is
asynchronous; the durations are read later, off the training thread, once
``event.query()`` says the GPU has passed the event (``elapsed_time`` between
two completed events never blocks). Nothing here synchronizes the device.

The event source is injectable (:class:`EventFactory`): tests pass a fake that
behaves like ``torch.cuda.Event``.
"""

from __future__ import annotations

import collections
import logging
import sys
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


@runtime_checkable
class TimingEvent(Protocol):
    """The part of ``torch.cuda.Event`` stepwatch uses."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event to ``end_event`` (another event of the same
        kind; both completed)."""
        ...


EventFactory = Callable[[], TimingEvent]


def torch_event_factory() -> EventFactory | None:
    """A factory of timing CUDA events when the script already uses torch with CUDA.

    torch is looked up in ``sys.modules`` only: importing it here would cost
    seconds in a process that does not use it.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        event_cls = torch.cuda.Event
    except Exception as err:  # a broken CUDA install must not stop training
        logger.warning("stepwatch cuda: torch.cuda unusable, using wall time err=%s", err)
        return None

    def factory() -> TimingEvent:
        event: TimingEvent = event_cls(enable_timing=True)
        return event

    return factory


class EventPool:
    """Reuses events once their step is resolved: creation stays off the steady state.

    ``take`` runs on the training thread, ``give`` on the sender thread; deque
    appends and pops are atomic under the GIL.
    """

    def __init__(self, factory: EventFactory, limit: int = 4096) -> None:
        self._factory = factory
        self._free: collections.deque[TimingEvent] = collections.deque()
        self._limit = limit

    def take(self) -> TimingEvent:
        try:
            return self._free.pop()
        except IndexError:
            return self._factory()

    def give(self, events: list[TimingEvent]) -> None:
        if len(self._free) < self._limit:
            self._free.extend(events)


def all_done(events: list[TimingEvent]) -> bool:
    """True when the GPU has passed every event (non-blocking ``query``)."""
    return all(event.query() for event in reversed(events))


def elapsed_ns(start: TimingEvent, end: TimingEvent) -> int:
    """Nanoseconds between two completed events."""
    return max(0, round(start.elapsed_time(end) * 1e6))
