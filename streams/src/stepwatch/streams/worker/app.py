"""The Faust application: one agent over the four telemetry topics, one timer.

Topology (docs/streams.md)::

    <prefix>.steps ─┐
    <prefix>.gpu   ─┤ one multi-topic channel, raw bytes,     ┌─► <prefix>.detections
    <prefix>.ports ─┼─► agent "telemetry" (a batch per fetch) ─┤   (key = job id, same
    <prefix>.events─┘   decode → dedup → Engine per partition  │    partition number)
                              ▲                                ├─► <prefix>.dlq
                        timer "tick" (1 s): hangs, metrics,    └─► table open-detections
                        consumer lag                               (changelog, per partition)

Everything of a job is in one partition number of every topic (keyed by job
at the producer, topics co-partitioned): no repartitioning anywhere. Faust's
assignor gives partition *n* of every input topic, and of the table's
changelog, to the same worker.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import faust
from faust.types import TP

from stepwatch.contract import Topics
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings
from stepwatch.streams.worker.admission import AdmissionConfig
from stepwatch.streams.worker.faust_config import faust_kafka
from stepwatch.streams.worker.ledger import Ledger
from stepwatch.streams.worker.metrics import StreamMetrics
from stepwatch.streams.worker.placement import Placement
from stepwatch.streams.worker.processor import EngineFactory, StreamProcessor
from stepwatch.streams.worker.publisher import DeliveryAborted, Publisher, Write
from stepwatch.streams.worker.transport import (
    LeanTransport,
    QuietMonitor,
    RawSchema,
    faust_version_problem,
    handle_batch,
)

log = logging.getLogger(__name__)
#: a publish waiting longer than this stops the timer's hang checks (Publisher.stalled)
STALL_SECONDS = 5.0
#: seconds a record may wait in the producer before its send fails (see _timeouts)
PRODUCER_REQUEST_TIMEOUT = 30.0
LEDGER_TABLE = "open-detections"
#: young-generation threshold of the cyclic GC while the worker runs (Python's default: 700)
GC_GEN0_THRESHOLD = 50_000


def tune_gc(gen0: int = GC_GEN0_THRESHOLD) -> None:
    """Keep the cyclic garbage collector off the hot path of a long-running worker.

    Every decoded message allocates a few GC-tracked containers, so with
    Python's default threshold (700 allocations) a young collection runs every
    few dozen messages and a full one, which walks every object of the
    process (Faust, aiokafka, the modules, the host windows), every few
    thousand: ~7 % of the worker's CPU on ``bench/bench_stream.py``. The
    objects alive after start-up live as long as the process:
    ``gc.freeze()`` moves them out of the collector's sight, and a larger
    young generation lets most temporaries die by reference count before a
    collection sees them. Cycles are still collected.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)


@dataclass(frozen=True)
class StreamOptions:
    """The worker's knobs, derived from :class:`Settings` (``from_settings``); tests build
    them directly."""

    app_id: str = ""  # the consumer group; default "stepwatch-stream.<topic prefix>"
    worker_name: str = ""  # in logs and dead letters; default host:pid
    data_dir: str = "var/stream"
    web_port: int = 0  # Faust's own web server; 0 keeps it off
    batch_max: int = 2000  # Kafka messages per batch
    batch_within: float = 0.05  # seconds to wait for a batch to fill (stock mode only)
    tick_seconds: float = 1.0
    unread_seconds: float = 10.0  # see stepwatch.streams.worker.sight
    standby_replicas: int = 1
    grace_steps: int = 64  # inherited detections not re-confirmed within this are resolved
    silence_seconds: float = 3600.0
    lean_consumer: bool = True
    session_timeout: float | None = 6.0  # seconds; None: Faust's 60 (see _timeouts)
    rebalance_timeout: float | None = None  # seconds; Faust's default is 60 (see _timeouts)

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamOptions:
        """The worker's options as the one settings model gives them."""
        return cls(
            app_id=settings.stream_app_id,
            worker_name=settings.stream_worker_name,
            data_dir=settings.stream_data_dir,
            web_port=settings.stream_web_port,
            batch_max=settings.stream_batch,
            batch_within=settings.stream_batch_within,
            tick_seconds=settings.stream_tick_seconds,
            unread_seconds=settings.stream_unread_seconds,
            standby_replicas=settings.stream_standby_replicas,
            grace_steps=settings.stream_restore_grace_steps,
            lean_consumer=not settings.stream_stock_consumer,
            session_timeout=settings.stream_session_timeout or None,
            rebalance_timeout=settings.stream_rebalance_timeout or None,
        )

    def resolved_app_id(self, settings: Settings) -> str:
        return self.app_id or f"stepwatch-stream.{settings.topic_prefix}"

    def resolved_worker(self) -> str:
        return self.worker_name or f"{socket.gethostname()}:{os.getpid()}"


class TableStore:
    """The ledger's store over the Faust table ``open-detections``.

    Reads and local writes go to the table's store at once; the changelog
    writes are queued until the publisher takes them (:meth:`take`) with the
    outputs of the same processing, and :meth:`send` produces one to the
    partition of its job (Faust would take the partition of the event being
    processed, undefined in a batch that mixes partitions and in the timer).
    The publisher waits for each to be acknowledged before the next: one record
    per produce request also keeps Tansu (the dev broker, which reports a high
    watermark of the last batch's base offset + 1) from hiding the tail of the
    changelog from Faust's table recovery.
    """

    def __init__(self, table: Any) -> None:
        self.table = table
        self.pending: list[Write] = []

    def values(self) -> Iterable[bytes]:
        return list(self.table.data.values())

    def __contains__(self, key: object) -> bool:
        return key in self.table.data

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        self.pending.append(Write(key, value, partition, self.table.data.get(key)))
        self.table.data[key] = value

    def delete(self, key: bytes, partition: int) -> None:
        self.pending.append(Write(key, None, partition, self.table.data.pop(key, None)))

    def take(self) -> list[Write]:
        """The changelog writes queued since the last call, in order."""
        taken, self.pending = self.pending, []
        return taken

    def undo(self, writes: list[Write]) -> None:
        """Put the table back as it was before ``writes`` (never sent)."""
        for w in reversed(writes):
            if w.before is None:
                self.table.data.pop(w.key, None)
            else:
                self.table.data[w.key] = w.before

    async def send(self, write: Write) -> Awaitable[Any]:
        """Produce one changelog write; the future of its acknowledgement."""
        return cast(
            "Awaitable[Any]",
            await self.table.changelog_topic.send(
                key=write.key,
                value=write.value,
                partition=write.partition,
                key_serializer="raw",
                value_serializer="raw",
            ),
        )


class _StreamApp(faust.App):
    lean_consumer = True
    # read by stepwatch.streams.worker.transport.LeanConsumer
    aligned_topics: frozenset[str] | None = None
    batch_topics: frozenset[str] | None = None  # records handed to batch_handler per fetch
    batch_handler: Callable[[list[Any]], Awaitable[None]] | None = None
    batch_max: int = 2000

    def _new_transport(self) -> Any:
        if not self.lean_consumer:
            return super()._new_transport()
        return LeanTransport(self.conf.broker_consumer, self)


@dataclass
class StreamService:
    """The app and the objects a caller may want to look at."""

    app: faust.App
    processor: StreamProcessor
    metrics: StreamMetrics
    table: Any
    store: TableStore
    worker: str


def default_engine_factory(settings: Settings) -> EngineFactory:
    from stepwatch.streams.core import DetectConfig, Engine

    config = DetectConfig.from_settings(settings)
    return lambda: Engine(config)


def create_app(
    settings: Settings,
    options: StreamOptions | None = None,
    engine_factory: EngineFactory | None = None,
    metrics: StreamMetrics | None = None,
) -> StreamService:
    """Build the Faust app for ``settings``; run it with a Faust ``Worker``."""
    options = options or StreamOptions()
    kafka = faust_kafka(settings.bootstrap_servers, settings.kafka_config)
    if kafka.ignored:
        log.warning("kafka settings not used by the stream worker keys=%s", ",".join(kafka.ignored))
    app = _StreamApp(
        kafka.group_id or options.resolved_app_id(settings),
        broker=kafka.broker,
        broker_credentials=kafka.credentials,
        datadir=os.path.abspath(options.data_dir),
        web_enabled=options.web_port > 0,
        web_port=options.web_port or 6066,
        web_bind="127.0.0.1",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=options.standby_replicas,
        broker_max_poll_records=None,  # all buffered partitions per fetch: see EventTimeAligner
        stream_buffer_maxsize=max(4096, 2 * options.batch_max),
        **_lean(options),
        **_timeouts(options, kafka.conf),
        **kafka.conf,
    )
    app.lean_consumer = options.lean_consumer
    app.aligned_topics = frozenset(Topics(settings.topic_prefix).telemetry())
    worker = options.resolved_worker()
    metrics = metrics or StreamMetrics()
    table = app.Table(
        LEDGER_TABLE,
        key_type=bytes,
        value_type=bytes,
        partitions=settings.partitions,
        help="Open detections by id (stepwatch ledger)",
    )
    store = TableStore(table)
    ledger = Ledger(store, options.grace_steps)
    processor = StreamProcessor(
        Topics(settings.topic_prefix),
        engine_factory or default_engine_factory(settings),
        metrics,
        ledger,
        worker,
        silence_seconds=options.silence_seconds,
        unread_seconds=options.unread_seconds,
        max_message_bytes=settings.max_message_bytes,
        admission=admission_config(settings),
        placement=Placement(settings.partitions) if settings.stream_check_partition else None,
    )
    _wire(app, settings, options, processor, metrics, store, worker)
    return StreamService(app, processor, metrics, table, store, worker)


def admission_config(settings: Settings) -> AdmissionConfig:
    """The admission bounds (stepwatch.streams.worker.admission) as the settings give them;
    jobs and hosts give their places up after the detection core's own silence limits."""
    from stepwatch.streams.core import DetectConfig

    detect = DetectConfig.from_settings(settings)
    return AdmissionConfig(
        future_seconds=settings.stream_future_seconds,
        max_age_seconds=settings.stream_max_age_seconds,
        step_jump_min=settings.stream_step_jump_min,
        step_jump_factor=settings.stream_step_jump_factor,
        max_world_size=settings.stream_max_world_size,
        max_ranks=settings.stream_max_ranks,
        max_hosts=settings.stream_max_hosts,
        job_idle_seconds=detect.job_silence_seconds,
        host_idle_seconds=detect.host_silence_seconds,
    )


def _lean(options: StreamOptions) -> dict[str, Any]:  # keyword arguments for faust.App
    """Faust settings of the lean mode (stepwatch.streams.worker.transport); none in stock mode."""
    if not options.lean_consumer:
        return {}
    problem = faust_version_problem()
    if problem:
        raise ConfigError(problem)
    # a shutdown waits for the tracked records of the batch in flight (handle_batch)
    return {"Monitor": QuietMonitor, "stream_wait_empty": True}


def _timeouts(options: StreamOptions, conf: dict[str, Any]) -> dict[str, Any]:
    """Consumer-group session timeout, heartbeat and rebalance timeout.

    A crashed worker's partitions move only once the coordinator expires its
    session, and aiokafka's eager rebalance stops every member's partitions
    until the group has rejoined: the session timeout bounds both the
    takeover and the survivors' stall. Tansu (the dev broker) also answers a
    JoinGroup only after half the session timeout. 6 s (Kafka's default
    ``group.min.session.timeout.ms``) with a 1 s heartbeat measured a 12 s
    takeover and a 4 s stall where Faust's 60 s took 92 s and 31 s
    (``bench/takeover.py``, docs/streams.md "Availability").
    ``-X session.timeout.ms`` / ``heartbeat.interval.ms`` win over this.

    The producer's request timeout (Faust's default 1200 s) bounds how long a
    record waits in the producer before its send fails, and so how long a
    rebalance waits on Faust's producer flush while the broker is away: 30 s
    (Kafka's ``request.timeout.ms`` default); the publisher sends again what
    failed (``stepwatch.streams.worker.publisher``).
    """
    out: dict[str, Any] = {"producer_request_timeout": PRODUCER_REQUEST_TIMEOUT}
    if options.rebalance_timeout is not None:
        out["broker_rebalance_timeout"] = options.rebalance_timeout
    if options.session_timeout is None:
        return out
    if "broker_session_timeout" not in conf:
        out["broker_session_timeout"] = options.session_timeout
    if "broker_heartbeat_interval" not in conf:
        out["broker_heartbeat_interval"] = max(0.1, min(3.0, options.session_timeout / 6))
    return out


def _wire(
    app: _StreamApp,
    settings: Settings,
    options: StreamOptions,
    processor: StreamProcessor,
    metrics: StreamMetrics,
    store: TableStore,
    worker: str,
) -> None:
    topics = Topics(settings.topic_prefix)
    telemetry = set(topics.telemetry())
    channel = app.topic(
        *topics.telemetry(),
        schema=RawSchema(key_type=bytes, value_type=bytes),
        partitions=settings.partitions,
    )
    publisher = Publisher(
        app,
        metrics,
        store,
        dlq_topic=topics.dlq,
        worker=worker,
        owned=lambda partition: partition in processor.assigned,
    )
    state: dict[str, Any] = {"ready": False, "ticked": math.inf}  # ticked: the last tick's time

    async def deliver(messages: list[Any]) -> None:
        """Process a batch and deliver its outputs; :class:`DeliveryAborted` when the
        batch stopped being this worker's first (``handle_batch`` then leaves it
        unacknowledged, to be read again)."""
        try:
            outputs = processor.process_batch(messages)
        except Exception as err:  # a bug here must not stop the partition
            metrics.errors.labels("batch").inc()
            publisher.log_once("batch", "batch failed size=%d error=%r", len(messages), err)
            # its outputs are gone: so are its writes
            start_over({m.partition for m in messages}, store.take())
            return
        generation = app.consumer_generation_id
        await publisher.publish(outputs, store.take(), lambda: _gone(app, generation))

    def start_over(parts: Iterable[int], writes: list[Write]) -> None:
        """Undo ``writes`` (made by the processing that just failed, never sent) and
        forget the partitions' state: built again from the ledger as sent."""
        store.undo(writes)
        processor.forget(parts)

    async def process(messages: list[Any]) -> None:
        """``deliver`` for Faust's own per-event path, which acknowledges the events
        whatever happens: outputs abandoned there are lost, and logged."""
        try:
            await deliver(messages)
        except DeliveryAborted as err:
            log.warning("outputs lost on Faust's per-event path: %s", err)

    async def consume(stream: Any) -> None:
        """The agent: its stream subscribes the topics. In lean mode the consumer hands
        their records to ``process`` per fetch (``handle_batch``) and none reach the
        stream; one that did would go through Faust's own per-event path."""
        if options.lean_consumer:
            async for event in stream.events():
                await process([event.message])
            return
        async for events in stream.take_events(options.batch_max, within=options.batch_within):
            await process([event.message for event in events])

    app.agent(channel, name="telemetry")(consume)
    if options.lean_consumer:
        app.batch_topics = frozenset(telemetry)
        app.batch_max = options.batch_max
        app.batch_handler = lambda messages: handle_batch(app, messages, deliver)

    async def tick() -> None:
        """Time-driven outputs (hangs, resolutions on silence). Interrupted by a
        rebalance, they wait in the publisher's backlog (sent first by the next
        publish if their partition stayed, else lost with it)."""
        if not state["ready"]:
            return
        metrics.set_lag(processor.lag(lambda t, p: _highwater(app, t, p)))
        now = time.time()
        last, state["ticked"] = state["ticked"], now
        if now - last > options.unread_seconds:  # this worker was paused (streams.worker.sight)
            processor.lose_sight(last)
        if publisher.stalled(STALL_SECONDS):  # the silence is ours: no hang checks
            publisher.log_once("stall", "outputs undelivered: hang checks wait for them")
            processor.lose_sight(now)
            return
        generation = app.consumer_generation_id
        outputs = processor.tick(now, _answered(app, telemetry, processor.assigned))
        try:
            await publisher.publish(outputs, store.take(), lambda: _gone(app, generation))
        except DeliveryAborted as err:  # a rebalance or a stop
            log.warning("timer outputs wait for the next publish: %s", err)

    app.timer(options.tick_seconds, name="tick")(tick)

    async def on_revoked(sender: Any, revoked: Iterable[TP], **_: Any) -> None:
        state["ready"] = False
        metrics.ready.set(0)
        # until the new assignment is heard, the rebalance's time is not the jobs' silence
        processor.lose_sight(time.time())

    async def on_assigned(sender: Any, assigned: Iterable[TP], **_: Any) -> None:
        parts = sorted({tp.partition for tp in assigned if tp.topic in telemetry})
        processor.assign(parts)
        log.info("partitions assigned worker=%s partitions=%s", worker, parts)

    async def on_rebalance_complete(sender: Any, **_: Any) -> None:
        processor.activate()
        processor.refresh_snapshot()
        state["ready"] = True
        metrics.ready.set(1)
        log.info("stream ready worker=%s partitions=%s", worker, sorted(processor.assigned))

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]
    app.on_rebalance_complete.connect(on_rebalance_complete)  # type: ignore[arg-type]


def _highwater(app: faust.App, topic: str, partition: int) -> int | None:
    try:
        value = app.consumer.highwater(TP(topic, partition))
    except Exception:
        return None
    return None if value is None else int(value)


def _answered(
    app: faust.App, topics: Iterable[str], partitions: Iterable[int]
) -> dict[tuple[str, int], float | None] | None:
    """Per (input topic, partition), when the broker last answered this worker's fetch of
    it (aiokafka's ``last_poll_timestamp``: set by every fetch response, an empty one too;
    None: none since the assignment). A topic-partition the client cannot say for is left
    out; None where the client cannot be read at all: the hang checks then run as before."""
    client = getattr(getattr(app.consumer, "_thread", None), "_consumer", None)
    if client is None:
        return None
    out: dict[tuple[str, int], float | None] = {}
    for p in partitions:
        for topic in topics:
            try:
                stamp = client.last_poll_timestamp(TP(topic, p))
            except Exception:  # not assigned (a rebalance), or no such method
                continue
            out[(topic, p)] = None if stamp is None else stamp / 1000.0
    return out


def _gone(app: Any, generation: int) -> bool:
    """The batch (or the timer's outputs) is no longer this worker's to finish: the
    worker stops, or a rebalance suspended the flow (Faust does so before it waits for
    the records in flight) or ended the consumer generation it was made in."""
    return bool(
        app.should_stop
        or not app.flow_control.is_active()
        or app.consumer_generation_id != generation
    )
