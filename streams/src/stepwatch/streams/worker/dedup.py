"""Drop duplicates and out-of-order host samples before the detection core sees them.

Agents retry and replay their spool after an outage, so the same message can
arrive twice (at-least-once delivery), and a replayed spool interleaves old
messages with new ones. What is dropped, and why:

* **step records** — by ``(job, rank, step)``. Per ``(job, rank)`` the filter
  keeps the highest step seen and a bitmask of the ``window`` steps below it:
  a step already in the mask is a ``duplicate``; a step older than the window
  is ``stale`` (the core closed that step long ago). A new step below the
  high-water mark (out of order, not seen before) is kept: the core's step
  assembly places it.
* **GPU and port samples** — by ``(host, kind)`` timestamp: a sample not newer
  than the last one of that host is a ``duplicate`` (same ``ts``) or
  ``out_of_order`` (older). Rates come from consecutive cumulative counters;
  an old sample in between would read as a counter reset.
* **events** — by ``(host, inst, seq)`` when the sender stamps ``inst``. An
  event further behind the sender's highest number than the window is kept:
  one forged event with a huge ``seq`` must not make the sender's real events
  (an XID, a ``job_end``) look stale.

Memory is bounded: at most ``max_jobs`` jobs (least recently seen evicted),
at most ``world_size`` ranks a job (the contract rejects other ranks), one
entry per host.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from stepwatch.contract import (
    EventMessage,
    GpuMessage,
    Message,
    PortMessage,
    StepMessage,
    StepRecord,
)
from stepwatch.contract.seen import DropReason, SeenWindow

__all__ = ["Deduplicator", "DropReason", "SeenWindow"]

# a tuple: ``GpuMessage | PortMessage`` in the call built a union object per message
_SAMPLES = (GpuMessage, PortMessage)


class Deduplicator:
    """Admit each message at most once; count what was dropped and why."""

    def __init__(self, window: int = 256, max_jobs: int = 4096, max_hosts: int = 65536) -> None:
        self.window = window
        self.max_jobs = max_jobs
        self.max_hosts = max_hosts
        self._jobs: OrderedDict[str, SeenWindow] = OrderedDict()
        self._sample_ts: dict[tuple[str, str], float] = {}
        self._events = SeenWindow(window)
        self.dropped: dict[tuple[str, DropReason], int] = {}

    def admit(self, message: Message) -> Message | None:
        """The message with duplicate records removed, or None to drop it whole."""
        if isinstance(message, StepMessage):
            return self._admit_steps(message)
        if isinstance(message, _SAMPLES):
            return self._admit_sample(message)
        if isinstance(message, EventMessage) and message.inst:
            reason = self._events.admit((message.host, message.inst), message.seq)
            if reason is not None and reason is not DropReason.STALE:
                self._count("event", reason)
                return None
        return message

    def forget_job(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def _admit_steps(self, message: StepMessage) -> StepMessage | None:
        kept: list[StepRecord] | None = None
        steps = message.steps
        job: str | None = None
        window = self._events  # replaced on the first record
        for i, rec in enumerate(steps):
            if rec.job_id != job:
                job = rec.job_id
                window = self._window_for(job)
            reason = window.admit(rec.rank, rec.step)
            if reason is None:
                if kept is not None:
                    kept.append(rec)
                continue
            self._count("step", reason)
            if kept is None:
                kept = list(steps[:i])
        if kept is None:
            return message
        if not kept:
            return None
        return msgspec.structs.replace(message, steps=kept)

    def _window_for(self, job_id: str) -> SeenWindow:
        jobs = self._jobs
        window = jobs.get(job_id)
        if window is None:
            window = jobs[job_id] = SeenWindow(self.window)
            if len(jobs) > self.max_jobs:
                jobs.popitem(last=False)
        elif next(reversed(jobs)) != job_id:
            jobs.move_to_end(job_id)
        return window

    def _admit_sample(self, message: GpuMessage | PortMessage) -> Message | None:
        kind = "gpu" if isinstance(message, GpuMessage) else "port"
        key = (message.host, kind)
        last = self._sample_ts.get(key)
        if last is not None and message.ts <= last:
            reason = DropReason.DUPLICATE if message.ts == last else DropReason.OUT_OF_ORDER
            self._count(kind, reason)
            return None
        if last is None and len(self._sample_ts) >= self.max_hosts:
            self._sample_ts.clear()  # pathological host churn: start over rather than grow
        self._sample_ts[key] = message.ts
        return message

    def _count(self, kind: str, reason: DropReason) -> None:
        key = (kind, reason)
        self.dropped[key] = self.dropped.get(key, 0) + 1

    def take_dropped(self) -> dict[tuple[str, DropReason], int]:
        """Drop counts since the last call (for metrics)."""
        out, self.dropped = self.dropped, {}
        return out
