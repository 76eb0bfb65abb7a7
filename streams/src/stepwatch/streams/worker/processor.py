"""The stream worker's logic, free of Faust: raw Kafka records in, outputs back.

:class:`StreamProcessor` is what the Faust agent and timer (``stepwatch.streams.worker.app``)
drive, and what unit tests drive without a broker. It owns one
:class:`PartitionState` per assigned partition number: a detection core
(``Analyzer``), a deduplicator and the partition's detection ledger. The
topics are co-partitioned and keyed by job, so a partition number holds whole
jobs: dropping a revoked partition drops exactly its jobs' state, and nothing
is shared between partitions (no locks, no cross-partition bookkeeping).

Per batch the processor decodes each record (``stepwatch.contract.decode``:
msgspec, one call per Kafka message, a message carries a whole node tick),
routes bad records to the dead-letter topic, drops duplicates, feeds the core,
passes the core's detections through the ledger and tallies metrics once per
batch rather than once per record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from stepwatch.contract import (
    KIND_OF,
    DetectionMessage,
    EventMessage,
    EventType,
    GpuMessage,
    Kind,
    PortMessage,
    StepMessage,
    Topics,
    decode,
    encode,
)
from stepwatch.contract.codec import MAX_MESSAGE_BYTES
from stepwatch.errors import ContractError
from stepwatch.logs import LogOnce
from stepwatch.streams.core.api import Analyzer, JobStats
from stepwatch.streams.worker.admission import Admission, AdmissionConfig, Gate
from stepwatch.streams.worker.capacity import Capacity
from stepwatch.streams.worker.dedup import Deduplicator
from stepwatch.streams.worker.dlq import DlqReason, dead_letter, encode_dead_letter
from stepwatch.streams.worker.ledger import Ledger, PartitionLedger
from stepwatch.streams.worker.metrics import Snapshot, StreamMetrics
from stepwatch.streams.worker.placement import Placement
from stepwatch.streams.worker.sight import NEVER, Sight

log = logging.getLogger(__name__)

EngineFactory = Callable[[], Analyzer]
#: (topic, partition) -> when the broker last answered a fetch of it (None: not since assigned)
Answers = Mapping[tuple[str, int], float | None]


class RawRecord(Protocol):
    """What the processor reads of a Kafka record (Faust's ``Message`` has these)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True)
class Output:
    """A record to produce: detections and dead letters."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int


@dataclass(frozen=True)
class Record:
    """A plain :class:`RawRecord` (tests, benchmarks)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class PartitionState:
    """Everything the worker holds for one partition number."""

    def __init__(
        self,
        partition: int,
        engine: Analyzer,
        ledger: PartitionLedger,
        admission: AdmissionConfig | None = None,
        capacity: Capacity | None = None,
    ) -> None:
        self.partition = partition
        self.engine = engine
        self.ledger = ledger
        self.gate = Gate(admission, capacity)
        self.dedup = Deduplicator()
        self.last_event_ts = 0.0
        self.sight = Sight(partition)  # the core's clock: time its input could be read


_RECORDS: dict[type, str] = {StepMessage: "steps", GpuMessage: "gpus", PortMessage: "ports"}
_CLASS_OF_KIND: dict[str, type] = {kind.value: cls for cls, kind in KIND_OF.items()}


class StreamProcessor:
    """Decode, validate, deduplicate, detect; one core per partition."""

    def __init__(
        self,
        topics: Topics,
        engine_factory: EngineFactory,
        metrics: StreamMetrics | None = None,
        ledger: Ledger | None = None,
        worker: str = "",
        clock: Callable[[], float] = time.time,
        silence_seconds: float = 3600.0,
        unread_seconds: float = 10.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        admission: AdmissionConfig | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.topics = topics
        self.placement = placement  # None: a message's partition is not checked
        self.admission = admission or AdmissionConfig()
        self.capacity = Capacity.of(self.admission)  # the worker's, shared by its partitions
        self.engine_factory = engine_factory
        self.metrics = metrics or StreamMetrics()
        self.ledger = ledger or Ledger()
        self.worker = worker
        self.clock = clock
        self.silence_seconds = silence_seconds
        self.unread_seconds = unread_seconds  # see streams.worker.sight
        self.max_message_bytes = max_message_bytes
        self.kind_of_topic = {
            topics.for_kind(k): k.value for k in (Kind.STEP, Kind.GPU, Kind.PORT, Kind.EVENT)
        }
        self.states: dict[int, PartitionState] = {}
        self.assigned: set[int] = set()
        self.positions: dict[tuple[str, int], int] = {}
        self.heard: dict[tuple[str, int], float] = {}  # (topic, partition) -> a record came
        self.assigned_at: dict[int, float] = {}  # partition -> this worker's clock at assignment
        self._log_once = LogOnce(log)

    # ------------------------------------------------------------------ partitions
    def assign(self, partitions: Iterable[int]) -> None:
        """The new assignment: forget every partition not in it."""
        self.assigned = set(partitions)
        now = self.clock()
        self.assigned_at = {p: now for p in self.assigned}  # not heard before this
        self.heard = {tp: t for tp, t in self.heard.items() if tp[1] in self.assigned}
        for p in [p for p in self.states if p not in self.assigned]:
            self.states.pop(p).gate.release()
            log.info("partition dropped partition=%d worker=%s", p, self.worker)
        self.positions = {tp: o for tp, o in self.positions.items() if tp[1] in self.assigned}
        self.metrics.partitions.set(len(self.assigned))

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the state of ``partitions`` (kept assigned): built again from the ledger
        as sent when their records come (``state``), as for a new owner."""
        for p in partitions:
            st = self.states.pop(p, None)
            if st is not None:
                st.gate.release()
                log.warning("partition state forgotten partition=%d worker=%s", p, self.worker)

    def activate(self) -> None:
        """Tables recovered: build state for every assigned partition now."""
        for p in sorted(self.assigned):
            self.state(p)

    def state(self, partition: int) -> PartitionState:
        st = self.states.get(partition)
        if st is None:
            st = PartitionState(
                partition,
                self.engine_factory(),
                self.ledger.for_partition(partition),
                self.admission,
                self.capacity,
            )
            self.states[partition] = st
            if st.ledger.inherited:
                log.info(
                    "detections inherited partition=%d open=%d worker=%s",
                    partition,
                    len(st.ledger.inherited),
                    self.worker,
                )
        return st

    # ------------------------------------------------------------------ the hot path
    def process_batch(self, records: Sequence[RawRecord]) -> list[Output]:
        """Process a batch of Kafka records in order; return what to produce.

        Per record, in this order: decode (a bad record becomes a dead letter),
        the topic's kind, the partition its key belongs on, admission
        (:meth:`Gate.check`), duplicates, the core and the ledger. The loop keeps to
        plain local look-ups: no object per record beyond the decoded message unless
        something is refused, dropped or found.
        """
        started = time.perf_counter()
        out: list[Output] = []
        tally: dict[tuple[str, str], int] = {}
        messages: dict[str, int] = {}
        events: dict[str, int] = {}
        positions = self.positions
        heard = self.heard
        kind_of_topic = self.kind_of_topic
        class_of_kind = _CLASS_OF_KIND
        states = self.states
        clock = self.clock
        max_bytes = self.max_message_bytes
        placement = self.placement
        now = clock()
        for rec in records:
            topic, partition = rec.topic, rec.partition
            positions[(topic, partition)] = rec.offset
            kind = kind_of_topic.get(topic, "unknown")
            messages[kind] = messages.get(kind, 0) + 1
            try:
                message = decode(rec.value or b"", now=clock, max_bytes=max_bytes)
            except ContractError as err:
                out.append(self._dead(rec, DlqReason.of(err), err.detail, tally))
                continue
            cls = type(message)
            if cls is not class_of_kind.get(kind):
                detail = f"a {KIND_OF[cls].value} message on the {kind} topic"
                out.append(self._dead(rec, DlqReason.WRONG_TOPIC, detail, tally))
                continue
            if placement is not None:
                misplaced = placement.misplaced(message, partition)
                if misplaced is not None:
                    out.append(self._dead(rec, DlqReason.WRONG_PARTITION, misplaced, tally))
                    continue
            st = states.get(partition) or self.state(partition)
            heard[(topic, partition)] = now
            seen = st.sight.clock(now)  # the core's clock (streams.worker.sight)
            st.gate.unseen = now - seen  # the gate's idle clocks: seen time too
            try:  # as the core below: a bug here costs its record, not the batch
                gated = st.gate.check(message, now)
                if st.gate.evicted or st.gate.evicted_hosts:
                    out.extend(self._let_go(st, seen))
                if gated is not None:
                    if gated.refusals or gated.rewound:
                        out.extend(self._gated(st, rec, gated, tally))
                    if gated.message is None:
                        continue
                    message = gated.message
                admitted = st.dedup.admit(message)
            except Exception as err:
                out.append(self._failed(rec, err, tally))
                continue
            if admitted is None:
                continue
            attr = _RECORDS.get(cls)
            events[kind] = events.get(kind, 0) + (
                1 if attr is None else len(getattr(admitted, attr))
            )
            if admitted.ts > st.last_event_ts:
                st.last_event_ts = admitted.ts
            try:
                found = st.engine.process(admitted, seen)  # arrived: this worker's seen time
                if st.ledger.watching:
                    found.extend(st.ledger.observe(admitted, admitted.ts))
            except Exception as err:  # the core must never stop the worker
                out.append(self._failed(rec, err, tally))
                continue
            if cls is EventMessage:
                self._after_event(st, admitted)  # type: ignore[arg-type]
            if found:
                out.extend([self._publish(st, det) for det in found])
        for kind, n in messages.items():
            tally[("messages", kind)] = n
        for kind, n in events.items():
            tally[("events", kind)] = n
        self._flush_tally(tally)
        self.metrics.batch.observe(time.perf_counter() - started)
        return out

    def _failed(self, rec: RawRecord, err: Exception, tally: dict[tuple[str, str], int]) -> Output:
        self.metrics.errors.labels("process").inc()
        self._log_once(
            f"process:{type(err).__name__}",
            "processing failed (gate, duplicate filter or core) partition=%d offset=%d error=%r",
            rec.partition,
            rec.offset,
            err,
            level=logging.ERROR,
        )
        return self._dead(rec, DlqReason.PROCESSING_ERROR, repr(err), tally)

    @staticmethod
    def _after_event(st: PartitionState, message: EventMessage) -> None:
        if message.type == EventType.JOB_END and message.job_id:
            st.dedup.forget_job(message.job_id)

    def _let_go(self, st: PartitionState, now: float) -> list[Output]:
        """Jobs the gate let go to make room: the core and the duplicate filter forget
        them too (the core holds their memory); their open detections resolve."""
        out: list[Output] = []
        for job_id, why in st.gate.take_evicted():
            log.warning(
                "job forgotten to make room job_id=%s partition=%d why=%s",
                job_id,
                st.partition,
                why,
            )
            st.dedup.forget_job(job_id)
            out.extend(self._publish(st, det) for det in st.engine.forget(job_id, now, why))
        for host in st.gate.take_evicted_hosts():
            log.warning("host forgotten to make room host=%s partition=%d", host, st.partition)
            st.engine.forget_host(host)
        return out

    def _gated(
        self,
        st: PartitionState,
        rec: RawRecord,
        gated: Admission,
        tally: dict[tuple[str, str], int],
    ) -> list[Output]:
        """Restarted jobs' duplicate windows are forgotten; refusals become one dead letter."""
        for job_id in gated.rewound:
            st.dedup.forget_job(job_id)
            log.info(
                "job restarted from an earlier step job_id=%s partition=%d", job_id, rec.partition
            )
        if not gated.refusals:
            return []
        first = gated.refusals[0]
        detail = "; ".join(r.detail for r in gated.refusals[:20])
        if len(gated.refusals) > 20:
            detail += f"; and {len(gated.refusals) - 20} more"
        return [self._dead(rec, DlqReason(first.reason.value), detail, tally)]

    def _dead(
        self, rec: RawRecord, reason: DlqReason, detail: str, tally: dict[tuple[str, str], int]
    ) -> Output:
        tally[("dlq", reason.value)] = tally.get(("dlq", reason.value), 0) + 1
        letter = dead_letter(
            reason,
            detail,
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            key=rec.key,
            payload=rec.value,
            worker=self.worker,
            now=self.clock(),
        )
        return Output(self.topics.dlq, rec.key, encode_dead_letter(letter), rec.partition)

    def _publish(self, st: PartitionState, det: DetectionMessage) -> Output:
        det = st.ledger.record(det)
        if self.worker and det.producer != self.worker:
            det = msgspec.structs.replace(det, producer=self.worker)
        self.metrics.detections.labels(det.type, det.state).inc()
        if det.state == "open":
            log.info(
                "detection opened id=%s job_id=%s type=%s rank=%s cause=%s score=%s",
                det.id,
                det.job_id,
                det.type,
                det.rank,
                det.cause,
                det.score,
            )
        return Output(self.topics.detections, det.job_id.encode(), encode(det), st.partition)

    def _flush_tally(self, tally: dict[tuple[str, str], int]) -> None:
        self.metrics.count_batch(tally)
        for st in self.states.values():
            for (kind, reason), n in st.dedup.take_dropped().items():
                self.metrics.dropped.labels(kind, reason.value).inc(n)

    # ------------------------------------------------------------------ time
    def tick(self, now: float | None = None, answered: Answers | None = None) -> list[Output]:
        """Hang detection and window closing; refresh the metrics snapshot.

        ``answered``: per (input topic, partition), the driver's clock when the broker
        last answered this worker's fetch of it (None: not since the assignment; absent:
        not known); None: nothing known, the hang checks run on the worker's clock. A
        partition not heard for ``unread_seconds`` is not ticked, and the time it stays
        so does not count against its jobs (streams.worker.sight)."""
        now = self.clock() if now is None else now
        out: list[Output] = []
        for st in list(self.states.values()):
            p = st.partition
            heard = None if answered is None else self._heard(p, answered)
            if st.sight.judge(now, heard, self.assigned_at.get(p, NEVER), self.unread_seconds):
                continue
            seen = st.sight.clock(now)
            try:
                found = st.engine.tick(seen)
                found.extend(st.ledger.expire_silent(seen, self.silence_seconds))
            except Exception as err:
                self.metrics.errors.labels("tick").inc()
                self._log_once(
                    f"tick:{type(err).__name__}",
                    "tick failed partition=%d error=%r",
                    st.partition,
                    err,
                    level=logging.ERROR,
                )
                continue
            out.extend(self._publish(st, det) for det in found)
        self.refresh_snapshot()
        return out

    def _heard(self, partition: int, answered: Answers) -> list[float]:
        """When each input topic of ``partition`` was last heard: a fetch answer or a record
        (topics the driver knows nothing of are left out)."""
        out: list[float] = []
        for topic in self.kind_of_topic:
            key = (topic, partition)
            if key not in answered:
                continue
            answer = answered[key]
            out.append(max(NEVER if answer is None else answer, self.heard.get(key, NEVER)))
        return out

    def lose_sight(self, when: float | None = None) -> None:
        """The worker could not read from ``when`` on: its publish stalls (the consumer waits
        with it), a rebalance revoked its partitions, or its ticks stopped (it was paused).
        Every partition is unread from ``when`` until each of its topics is heard after it."""
        when = self.clock() if when is None else when
        for st in self.states.values():
            st.sight.lose(when)
        self.refresh_snapshot()

    def stats(self) -> list[JobStats]:
        return [s for st in self.states.values() for s in st.engine.stats()]

    def open_detections(self) -> list[DetectionMessage]:
        return [d for st in self.states.values() for d in st.ledger.open.values()]

    def refresh_snapshot(self) -> None:
        jobs = tuple(self.stats())
        opened = tuple(self.open_detections())
        scores = {(j.job_id, r): s for j in jobs for r, s in j.flagged_ranks.items()}
        self.metrics.job_collector.snapshot = Snapshot(jobs, opened, scores)
        self.metrics.jobs.set(len(jobs))
        self.metrics.unread.set(sum(st.sight.unread for st in self.states.values()))

    def lag(
        self,
        highwater: Callable[[str, int], int | None],
        position: Callable[[str, int], int | None] | None = None,
    ) -> dict[tuple[str, int], int]:
        """Messages behind the high watermark per (kind, partition).

        ``position`` gives the last offset read where this worker has not
        processed a record of the partition yet (e.g. resumed at the end).
        """
        out: dict[tuple[str, int], int] = {}
        for topic, kind in self.kind_of_topic.items():
            for p in self.assigned:
                high = highwater(topic, p)
                if high is None:
                    continue
                pos = self.positions.get((topic, p))
                if pos is None:
                    pos = position(topic, p) if position is not None else None
                if pos is not None:
                    out[(kind, p)] = max(0, high - (pos + 1))
        return out
