"""Open detections that outlive a worker: restart and partition moves.

The detection core keeps its state in memory; a restarted worker (or the
worker a partition moves to) starts it empty and rebuilds it from the stream.
Without help it would *re-open* every incident under a new id and never close
the old ones. The ledger prevents that:

* every detection the worker emits is written to a key-value store (the Faust
  table ``open-detections``, key = detection id, changelog partition = the
  job's partition; see :class:`stepwatch.streams.worker.app.TableStore`), and deleted when it
  resolves;
* when a worker takes a partition, the open entries of that partition are
  *inherited*. The fresh core will find the same incident again within its
  windows: its ``open`` for the same (job, type, rank, group) is turned into an
  ``update`` of the inherited id (same ``opened_at``, ``first_step``), and its
  later updates and resolution keep that id;
* an inherited entry the new core does not confirm is resolved by the ledger:
  a hang as soon as the job makes progress past the hung step, anything else
  once the job has advanced ``grace_steps`` steps without it, and everything
  of a job on its ``job_end`` event or after ``silence_seconds`` without a
  message from the job (the core forgets silent jobs the same way).

So a restart costs no duplicate opens and no dangling detections; what is
lost is only the core's windows, rebuilt from the stream within
``grace_steps``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from stepwatch.contract import (
    DetectionMessage,
    EventMessage,
    EventType,
    Message,
    StepMessage,
    clip_text,
)

NaturalKey = tuple[str, str, int | None, str]  # job, type, rank, group
HANG = "hang"


class LedgerStore(Protocol):
    """Where ledger entries live: key = detection id, written to the job's partition."""

    def values(self) -> Iterable[bytes]: ...

    def __contains__(self, key: object) -> bool: ...

    def put(self, key: bytes, value: bytes, partition: int) -> None: ...

    def delete(self, key: bytes, partition: int) -> None: ...


class DictStore:
    """An in-memory :class:`LedgerStore` (tests, the offline replay)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def values(self) -> Iterable[bytes]:
        return self.data.values()

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        self.data[key] = value

    def delete(self, key: bytes, partition: int) -> None:
        self.data.pop(key, None)


class LedgerEntry(msgspec.Struct, frozen=True):
    partition: int
    detection: DetectionMessage


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(LedgerEntry)


def natural_key(det: DetectionMessage) -> NaturalKey:
    return (det.job_id, det.type, det.rank, det.group)


@dataclass
class _Progress:
    first_step: int | None = None
    max_step: int | None = None


class PartitionLedger:
    """The ledger of one partition, as seen by its current owner."""

    def __init__(
        self,
        partition: int,
        store: LedgerStore,
        grace_steps: int = 64,
    ) -> None:
        self.partition = partition
        self.grace_steps = grace_steps
        self._store = store
        self.open: dict[str, DetectionMessage] = {}
        self.inherited: dict[NaturalKey, str] = {}
        self._alias: dict[str, str] = {}
        self._progress: dict[str, _Progress] = {}
        self._load()

    def _load(self) -> None:
        for raw in list(self._store.values()):
            try:
                entry = _decoder.decode(raw)
            except (msgspec.DecodeError, UnicodeDecodeError, TypeError):
                continue
            det = entry.detection
            if entry.partition != self.partition or det.state == "resolved":
                continue
            self.open[det.id] = det
            self.inherited[natural_key(det)] = det.id
            self._progress.setdefault(det.job_id, _Progress())

    # ------------------------------------------------------------------ engine output
    def record(self, det: DetectionMessage) -> DetectionMessage:
        """Store a detection from the core; return it as it must be published.

        A change of an inherited detection keeps the inherited id, ``opened_at``
        and ``first_step`` for every message to its resolution, and every
        message gets its identity: ``inst`` = the detection id, ``seq`` = one
        more than the last change stored (the core's own count otherwise).
        """
        if det.state == "open":
            old_id = self.inherited.pop(natural_key(det), None)
            if old_id is not None:
                self._alias[det.id] = old_id
                det = msgspec.structs.replace(det, state="update")
        if det.id in self._alias:
            alias = self._alias.pop(det.id) if det.state == "resolved" else self._alias[det.id]
            old = self.open[alias]
            det = msgspec.structs.replace(
                det, id=alias, opened_at=old.opened_at, first_step=old.first_step
            )
        det = self._identified(det)
        self._write(det)
        return det

    def _identified(self, det: DetectionMessage) -> DetectionMessage:
        prev = self.open.get(det.id)
        seq = det.seq if prev is None else prev.seq + 1
        if det.inst == det.id and det.seq == seq:
            return det
        return msgspec.structs.replace(det, inst=det.id, seq=seq)

    def _write(self, det: DetectionMessage) -> None:
        key = det.id.encode()
        if det.state == "resolved":
            self.open.pop(det.id, None)
            if key in self._store:
                self._store.delete(key, self.partition)
        else:
            self.open[det.id] = det
            self._store.put(key, _encoder.encode(LedgerEntry(self.partition, det)), self.partition)

    # ------------------------------------------------------------------ inherited entries
    @property
    def watching(self) -> bool:
        """Whether :meth:`observe` has anything to watch (inherited entries of a job)."""
        return bool(self._progress)

    def observe(self, message: Message, now: float) -> list[DetectionMessage]:
        """Watch the jobs of inherited detections; resolve the unconfirmed ones."""
        if not self._progress:
            return []
        if isinstance(message, StepMessage):
            job = message.job_id or (message.steps[0].job_id if message.steps else "")
            progress = self._progress.get(job)
            if progress is None or not message.steps:
                return []
            top = max(r.step for r in message.steps)
            if progress.first_step is None:
                progress.first_step = top
            progress.max_step = top if progress.max_step is None else max(progress.max_step, top)
            return self._expire(job, progress, now)
        if (
            isinstance(message, EventMessage)
            and message.type == EventType.JOB_END
            and message.job_id in self._progress
        ):
            return self._resolve_job(message.job_id, now, "job ended")
        return []

    def _expire(self, job: str, progress: _Progress, now: float) -> list[DetectionMessage]:
        out: list[DetectionMessage] = []
        assert progress.max_step is not None and progress.first_step is not None
        advanced = progress.max_step - progress.first_step
        for key, det_id in list(self.inherited.items()):
            if key[0] != job:
                continue
            det = self.open[det_id]
            if det.type == HANG:
                done = det.step is None or progress.max_step > det.step
                why = f"job progressed to step {progress.max_step}"
            else:
                done = advanced >= self.grace_steps
                why = f"not confirmed over {advanced} steps after the worker restarted"
            if done:
                out.append(self._resolve(key, now, why))
        if not any(k[0] == job for k in self.inherited):
            self._progress.pop(job, None)
        return out

    def expire_silent(self, now: float, silence_seconds: float) -> list[DetectionMessage]:
        """Resolve inherited entries of jobs silent for ``silence_seconds`` (event time)."""
        out: list[DetectionMessage] = []
        for key, det_id in list(self.inherited.items()):
            progress = self._progress.get(key[0])
            if progress is not None and progress.max_step is not None:
                continue
            if now - self.open[det_id].ts >= silence_seconds:
                out.append(self._resolve(key, now, f"job silent for {silence_seconds:.0f} s"))
        return out

    def _resolve_job(self, job: str, now: float, why: str) -> list[DetectionMessage]:
        keys = [k for k in self.inherited if k[0] == job]
        self._progress.pop(job, None)
        return [self._resolve(k, now, why) for k in keys]

    def _resolve(self, key: NaturalKey, now: float, why: str) -> DetectionMessage:
        det_id = self.inherited.pop(key)
        det = self.open[det_id]
        resolved = msgspec.structs.replace(
            det,
            state="resolved",
            ts=now,
            summary=clip_text(f"{det.summary} — resolved: {why}".strip()),
        )
        resolved = self._identified(resolved)
        self._write(resolved)
        return resolved


class Ledger:
    """All partitions' ledgers of one worker over one store."""

    def __init__(self, store: LedgerStore | None = None, grace_steps: int = 64) -> None:
        self.store: LedgerStore = DictStore() if store is None else store
        self.grace_steps = grace_steps

    def for_partition(self, partition: int) -> PartitionLedger:
        return PartitionLedger(partition, self.store, self.grace_steps)
