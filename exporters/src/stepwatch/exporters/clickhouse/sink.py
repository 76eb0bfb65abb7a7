"""The Kafka -> ClickHouse sink: batched, at-least-once, duplicate-free.

Loop: consume -> buffer per partition -> cut batches (size or age) -> record
each new batch's offsets in ``sink_batches`` -> insert its rows with a
deterministic ``insert_deduplication_token`` per (batch, table) -> note the
accepted sender numbers in ``sender_seqs`` -> write dead letters -> commit
the offsets. Offsets are committed only after the inserts
succeeded. After a crash the restarted sink replays from the committed offset,
cuts its first batches at the recorded offsets again, and ClickHouse drops the
inserts it already has (tables *and* rollups); a duplicate message from
upstream is dropped by its (host, inst, kind, seq) and content, in memory
(:mod:`stepwatch.exporters.clickhouse.senders`) or in ``sender_seqs``
(:mod:`stepwatch.exporters.clickhouse.accepted`), and, failing that,
collapsed by ReplacingMergeTree; the same number with other content is
dead-lettered, never inserted. See docs/store.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepwatch.contract import Kind, Topics
from stepwatch.contract.topics import message_kinds
from stepwatch.errors import StepwatchError, TransportError
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.kafka_source import TP, Source
from stepwatch.exporters.clickhouse.ops_rows import Mapper, ops_mappers
from stepwatch.exporters.clickhouse.planner import Batch, Planner
from stepwatch.exporters.clickhouse.prepare import FUTURE_SECONDS, Preparer, Record, dead_row
from stepwatch.exporters.clickhouse.senders import DEFAULT_MAX_SENDERS, DEFAULT_WINDOW, SenderFilter
from stepwatch.exporters.clickhouse.sink_metrics import SinkMetrics
from stepwatch.exporters.clickhouse.store import ClickHouseError, Store
from stepwatch.exporters.clickhouse.writer import StopRequested, Writer
from stepwatch.logs import LogOnce
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

PLAN_COLUMNS = (
    "consumer_group",
    "topic",
    "partition",
    "first_offset",
    "last_offset",
    "messages",
    "planned_at",
)


@dataclass(frozen=True)
class SinkConfig:
    group_id: str = "stepwatch-store"
    batch_messages: int = 5000  # per partition
    batch_seconds: float = 1.0
    poll_max: int = 10000
    poll_timeout: float = 0.2
    retry_initial: float = 0.5
    retry_max: float = 30.0
    lag_interval: float = 5.0
    release_seconds: float = 60.0  # how often ``release`` (the allocators' freed pages) runs
    max_message_bytes: int = 1 << 20  # the contract's size limit (Settings.max_message_bytes)
    raw_ttl_days: int = 0  # raw rows older than the tables keep them are dead letters; 0: no check
    detection_producers: frozenset[str] = frozenset()  # empty: detections from any producer
    dedup_window: int = DEFAULT_WINDOW  # sequence numbers remembered per sender
    dedup_max_senders: int = DEFAULT_MAX_SENDERS  # senders remembered (least recent evicted)
    future_seconds: float = FUTURE_SECONDS  # a timestamp further ahead: future_timestamp

    @classmethod
    def from_settings(cls, settings: Settings) -> SinkConfig:
        """The sink's knobs as the one settings model gives them."""
        producers = frozenset(
            p.strip() for p in settings.store_detection_producers.split(",") if p.strip()
        )
        return cls(
            group_id=settings.sink_group,
            batch_messages=settings.sink_batch_messages,
            batch_seconds=settings.sink_batch_seconds,
            max_message_bytes=settings.max_message_bytes,
            raw_ttl_days=settings.store_raw_ttl_days,
            detection_producers=producers,
            dedup_max_senders=settings.store_dedup_max_senders,
            future_seconds=settings.store_future_seconds,
        )

    def preparer(
        self,
        store: Store | None,
        ops: dict[str, Mapper] | None = None,
        kinds: Mapping[str, Kind] | None = None,
    ) -> Preparer:
        return Preparer(
            store,
            max_message_bytes=self.max_message_bytes,
            ops=ops,
            kinds=kinds,
            future_seconds=self.future_seconds,
            max_age_seconds=self.raw_ttl_days * 86400.0,
            producers=self.detection_producers,
            senders=SenderFilter(self.dedup_window, self.dedup_max_senders),
        )


def sink_topics(prefix: str) -> tuple[str, ...]:
    t = Topics(prefix)
    return (t.steps, t.gpu, t.ports, t.events, t.detections, *t.operations())


class Sink:
    """Consumes the telemetry, detection, alert and remediation topics into the store."""

    def __init__(
        self,
        store: Store,
        source: Source,
        topics: Sequence[str],
        config: SinkConfig = SinkConfig(),
        metrics: SinkMetrics | None = None,
        *,
        after_insert: Callable[[list[Batch]], None] | None = None,
        release: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.source = source
        self.topics = tuple(topics)
        self.config = config
        self.metrics = metrics or SinkMetrics()
        self.after_insert = after_insert
        self._stop = threading.Event()
        self.planner = Planner(config.batch_messages, config.batch_seconds, clock)
        self.preparer = config.preparer(
            store, ops=ops_mappers(self.topics), kinds=message_kinds(self.topics)
        )
        self.writer = Writer(
            store,
            self.metrics,
            retry_initial=config.retry_initial,
            retry_max=config.retry_max,
            should_stop=self._stop.is_set,
        )
        self._committed: dict[TP, int] = {}
        self._warn = LogOnce(log)
        self._last_lag = 0.0
        self.release = release
        self._last_release = clock()
        self._clock = clock

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        """Consume until :meth:`stop`; then flush, commit and close."""
        self.source.subscribe(self.topics, self._on_assign, self._on_revoke)
        self.metrics.ready.set(1)
        log.info(
            "sink ready group=%s topics=%s store=%s",
            self.config.group_id,
            ",".join(self.topics),
            self.store.backend,
        )
        try:
            while not self._stop.is_set():
                self.step()
            log.debug("sink flushing before stop buffered=%d", self.planner.buffered)
            self._write(self.planner.due(force=True))
        except StopRequested:
            log.warning("sink stopped during a retried insert: the batch will be replayed")
        finally:
            self.metrics.ready.set(0)
            log.debug("sink closing the consumer")
            self.source.close()
            log.info(
                "sink stopped rows=%d",
                int(
                    sum(
                        self.metrics.value("stepwatch_sink_rows_inserted_total", table=t)
                        for t in R.TABLES
                    )
                ),
            )

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> int:
        """One poll and the writes it made due; returns records consumed."""
        records = self.source.poll(self.config.poll_max, self.config.poll_timeout)
        for record in records:
            self.planner.add(record)
            self.metrics.messages.labels(record.topic).inc()
        for tp in self.source.resets():
            self._restart(tp)
        self._drop_lost_plans()
        self._write(self.planner.due())
        self.metrics.buffered.set(self.planner.buffered)
        self._update_lag()
        self._release()
        return len(records)

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, tps: list[TP]) -> None:
        committed = self.source.committed(tps)
        for tp in tps:
            offset = committed.get(tp)
            plans = self._load_plans(tp, offset)
            self.planner.assign(tp, plans)
            self._committed[tp] = offset or 0
            if plans:
                log.info(
                    "replaying planned batches topic=%s partition=%d batches=%d from=%s",
                    tp[0],
                    tp[1],
                    len(plans),
                    offset,
                )

    def _on_revoke(self, tps: list[TP]) -> None:
        try:
            self._write(self.planner.due(force=True, only=tps))
        except StopRequested:
            pass
        for tp in tps:
            self.planner.revoke(tp)
            self._committed.pop(tp, None)
            try:
                self.metrics.lag.remove(tp[0], str(tp[1]))
            except KeyError:
                pass

    def _restart(self, tp: TP) -> None:
        """The partition's log started again below what was read: write what is buffered
        of the old log (its offsets are not committed: the new log reuses them), then take
        the new one from its start, without the old plans (the planner would drop its
        offsets as re-deliveries)."""
        self._write(self.planner.due(force=True, only=[tp]), commit=False)
        self.planner.revoke(tp)
        self.planner.assign(tp)

    def _drop_lost_plans(self) -> None:
        """Plans a partition waits for that its log cannot complete: dropped.

        A plan is cut from records the sink read, so a live log always holds it;
        one that ends at or past the log's end (as the last fetch gave it) names
        records the log lost (a re-created topic, an unclean leader election, a
        restarted memory-only broker). Waiting for them would hold every new record
        of the partition back for good.
        """
        waiting = self.planner.waiting()
        if not waiting:
            return
        try:
            ends = self.source.log_end(waiting)
        except TransportError as err:
            self._warn("log-end", "cannot read the log end error=%s", err)
            return
        for tp, end in ends.items():
            dropped = self.planner.drop_plans(tp, end)
            if dropped:
                log.warning(
                    "planned batches beyond the log's end dropped (the log lost records) "
                    "topic=%s partition=%d dropped=%d log_end=%d",
                    tp[0],
                    tp[1],
                    dropped,
                    end,
                )

    def _load_plans(self, tp: TP, committed: int | None) -> list[tuple[int, int]]:
        delay = self.config.retry_initial
        while True:
            try:
                return self._query_plans(tp, committed)
            except ClickHouseError as err:
                if self._stop.is_set():
                    raise
                self.metrics.retries.labels("sink_batches").inc()
                log.warning("cannot read batch plans, retrying delay_s=%.1f error=%s", delay, err)
                time.sleep(delay * random.uniform(0.5, 1.5))  # jittered
                delay = min(delay * 2, self.config.retry_max)

    def _query_plans(self, tp: TP, committed: int | None) -> list[tuple[int, int]]:
        result = self.store.query(
            "SELECT first_offset, last_offset FROM sink_batches FINAL "
            "WHERE consumer_group = {g:String} AND topic = {t:String} AND partition = {p:UInt32} "
            "AND last_offset >= {c:UInt64} ORDER BY first_offset",
            {"g": self.config.group_id, "t": tp[0], "p": tp[1], "c": committed or 0},
        )
        return [(int(a), int(b)) for a, b in result.rows]

    # ------------------------------------------------------------------ writing
    def _write(self, batches: list[Batch], commit: bool = True) -> None:
        if not batches:
            return
        self._plan([b for b in batches if not b.replayed])
        for batch in batches:
            self._write_batch(batch)
        if self.after_insert is not None:
            self.after_insert(batches)
        if commit:
            self._commit({b.tp: b.last + 1 for b in batches})
        for batch in batches:
            self.metrics.batches.labels("replayed" if batch.replayed else "new").inc()

    def _plan(self, batches: list[Batch]) -> None:
        if not batches:
            return
        now = time.time()
        rows = [
            (self.config.group_id, b.topic, b.partition, b.first, b.last, len(b.records), now)
            for b in batches
        ]
        self.writer.insert("sink_batches", PLAN_COLUMNS, rows, token="")

    def _write_batch(self, batch: Batch) -> None:
        prepared = self.preparer.prepare(batch.records)
        self.metrics.duplicates.inc(prepared.duplicates)
        base = (
            f"{self.config.group_id}|{batch.topic}|{batch.partition}|{batch.first}-{batch.last}"
            f"|{content_fingerprint(batch.records)}"
        )
        now = time.time()
        for name, bucket in prepared.tables.items():
            refused = self.writer.insert_isolating(
                name, bucket.table.names, bucket.rows, f"{base}|{name}"
            )
            self.metrics.rows.labels(name).inc(len(bucket.rows) - len(refused))
            for index, error in refused:
                prepared.dead.append(
                    dead_row(bucket.sources[index], "rejected_by_store", error, now)
                )
        self._note_accepted(prepared.accepted, base)
        if prepared.dead:
            dl = R.DEAD_LETTERS
            refused = self.writer.insert_isolating(
                dl.name, dl.names, prepared.dead, f"{base}|{dl.name}"
            )
            for index, error in refused:
                log.error(
                    "dead letter refused by the store offset=%s error=%s",
                    prepared.dead[index][3],
                    error,
                )
            for index, row in enumerate(prepared.dead):
                if index not in {i for i, _ in refused}:
                    self.metrics.dead.labels(row[5]).inc()

    def _note_accepted(self, rows: list[tuple[Any, ...]], base: str) -> None:
        """The batch's accepted sender numbers, after its rows (see accepted.py)."""
        if not rows:
            return
        table = R.SENDER_SEQS
        refused = self.writer.insert_isolating(
            table.name, table.names, rows, f"{base}|{table.name}"
        )
        for index, error in refused:
            self._warn(
                "sender_seqs",
                "accepted sender number refused by the store number=%.120r error=%s",
                rows[index][1:5],
                error,
            )

    def _commit(self, offsets: dict[TP, int]) -> None:
        try:
            self.source.commit(offsets)
        except TransportError as err:
            # The rows are written; an uncommitted batch is replayed and deduplicated later.
            self._warn("commit", "offset commit failed (batches will be replayed) error=%s", err)
            return
        self._committed.update(offsets)
        self.metrics.last_commit.set(time.time())

    def _release(self) -> None:
        """Hand the allocators' freed memory back every ``release_seconds`` (an embedded store)."""
        if self.release is None or self._clock() - self._last_release < self.config.release_seconds:
            return
        self._last_release = self._clock()
        self.release()

    def _update_lag(self) -> None:
        now = time.monotonic()
        if now - self._last_lag < self.config.lag_interval or not self._committed:
            return
        self._last_lag = now
        try:
            for (topic, partition), lag in self.source.lag(dict(self._committed)).items():
                self.metrics.lag.labels(topic, str(partition)).set(lag)
        except StepwatchError as err:
            self._warn("lag", "lag update failed error=%s", err)


def content_fingerprint(records: Sequence[Record]) -> str:
    """CRC-32 over the batch's record values, in offset order, as 8 hex digits.

    Part of every insert's de-duplication token: a batch replayed after a crash
    reads the same records at the same offsets, so its token is the same and the
    store drops the repeat (exactly once). When offsets are reused by other
    records (the development broker lost its log; on a real cluster a topic
    re-created or a log truncated by an unclean leader election), the same
    offsets hold new content, the token differs, and the new records are stored
    instead of being dropped as duplicates of the old ones.
    """
    crc = 0
    for record in records:
        crc = zlib.crc32(record.value or b"", crc)
        crc = zlib.crc32(b"\x00", crc)  # value boundary: (ab, c) and (a, bc) differ
    return f"{crc:08x}"
