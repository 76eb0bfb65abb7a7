"""A leaner Faust consumer: the same delivery loop without two tasks per message.

Faust's ``Consumer._drain_messages`` hands every fetched record to the topic
conductor through ``wait_first(callback(message), suspend_flow.wait())``: two
asyncio tasks and a ``wait`` per Kafka message, which measured ~40 % of a
worker's CPU per message on the benchmark. :class:`LeanConsumer` awaits the
callback directly while the flow is not suspended and falls back to Faust's
``wait_first`` when it is (during a rebalance), so rebalancing behaves as
upstream. Everything else (gap tracking for acks, ``broker_commit_every``,
read offsets, stop conditions) is kept line for line.

Records of the topics the app names in ``batch_topics`` (the telemetry) skip
Faust's per-message path altogether: each fetch's records of those topics go
to the app's ``batch_handler`` as one list (at most ``batch_max``), which
processes and acknowledges them (:func:`handle_batch`) — no conductor call,
Faust event, channel queue or event ack per message (together about a third of
the Kafka/Faust layer's CPU in ``bench/bench_stream.py --floors``, ~9 % of the
worker's).
Flow control, generations, tracking and acks keep their meaning:
:func:`handle_batch` does per batch what the conductor and the agent's stream
did per message (records it does not process are not acknowledged, and a
shutdown lets the batch in flight finish).

Enabled by default (``StreamOptions.lean_consumer``); turn it off to run
stock Faust.

:class:`EventTimeAligner` replaces Faust's round-robin over topics. The
four input topics carry different message rates and sizes (a node sends a step
message per training step, a GPU and a port message per agent tick; a GPU
message is twice the size of a step message), so while a backlog drains a
fetch holds minutes of steps but only seconds of host samples, and
one-from-each-topic lets the steps run far ahead of the samples — while the
core attributes causes from host samples *around* a slow step. The aligner
merges each fetch by Kafka record timestamp and holds back, per partition, the
records newer than the oldest "last record" among the partitions *of the same
number* (one detection core's topics) that returned data; they go out with the
next fetch (or at once when a fetch brings nothing new). Order within a partition is
unchanged (only a suffix is held, and the merge is stable); a rebalance drops
what is held (Faust seeks back to the committed offsets); at most
``max_held`` records are held, so a producer with a skewed clock cannot stall
the others. In live operation a fetch spans a fraction of a second and little
is ever held.
"""

from __future__ import annotations

import asyncio
import heapq
import importlib
import importlib.metadata
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, cast

import faust
from faust.sensors.monitor import Monitor
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.transport.utils import DefaultSchedulingStrategy

from stepwatch.streams.worker.publisher import DeliveryAborted

log = logging.getLogger(__name__)

#: aiokafka modules that bind ``lz4_decode`` at import (the C record reader first)
_LZ4_USERS = (
    "aiokafka.record._crecords.default_records",
    "aiokafka.record._crecords.legacy_records",
    "aiokafka.record.default_records",
    "aiokafka.record.legacy_records",
    "aiokafka.protocol.message",
)


# The faust-streaming series whose consumer internals this module copies
# (``_drain_messages``, ``_read_offset``, ``_add_gap``); pyproject pins the same range.
SUPPORTED_FAUST = (0, 15)


def faust_version_problem(version: str | None = None) -> str | None:
    """Why the installed faust-streaming does not fit the lean consumer (None: it fits)."""
    found = version or importlib.metadata.version("faust-streaming")
    parts = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    if parts == SUPPORTED_FAUST:
        return None
    want = ".".join(map(str, SUPPORTED_FAUST))
    return (
        f"faust-streaming {found} is installed but the lean consumer "
        f"(stepwatch.streams.worker.transport) copies the internals of {want}.x: install the "
        f"locked version (bash scripts/setup.sh, or pip install 'faust-streaming=={want}.*'), "
        f"or run the worker with --stock-consumer; to support {found}, re-read Faust's "
        f"Consumer._drain_messages and update LeanConsumer and SUPPORTED_FAUST together"
    )


class LeanConsumer(faust_aiokafka.Consumer):
    """aiokafka-driver consumer with a cheaper per-message hand-off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aligner = EventTimeAligner(
            self.app, getattr(self.app, "aligned_topics", None), self._lagging
        )
        self.scheduler = self.aligner

    def _lagging(self) -> list[Any]:
        """Aligned partitions with records not read yet (per the fetched high watermark)."""
        aligner = self.aligner
        out = []
        try:
            for tp in self.assignment():
                if aligner.topics is not None and tp.topic not in aligner.topics:
                    continue
                high = self.highwater(tp)
                read = self._read_offset.get(tp)
                if high is not None and high > (-1 if read is None else read) + 1:
                    out.append(tp)
        except Exception:  # no assignment yet, consumer stopping: align what is fetched
            return []
        return out

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - needs a broker
        callback = self.callback
        getmany = self.getmany
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        suspended = self.suspend_flow.is_set
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        sleep = asyncio.sleep
        yield_every = 100
        since_yield = 0
        handler = getattr(self.app, "batch_handler", None)
        batch_topics: frozenset[str] = getattr(self.app, "batch_topics", None) or frozenset()
        batch_max = int(getattr(self.app, "batch_max", 2000))
        batch: list[Any] = []
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                ait = cast("AsyncIterator[tuple[Any, Any]]", getmany(timeout=1.0))
                await self.sleep(0)
                if self.should_stop:
                    continue
                async for tp, message in ait:
                    since_yield += 1
                    if since_yield > yield_every:
                        await sleep(0)
                        since_yield = 0
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is not None and offset < r_offset:
                        continue
                    gap = offset - (r_offset or 0)
                    if gap > 1 and r_offset and acks_enabled_for(message.topic):
                        await self._add_gap(tp, r_offset + 1, offset)
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    if handler is not None and message.topic in batch_topics:
                        batch.append(message)  # handed over whole, below
                        set_read_offset(tp, offset)
                        if len(batch) >= batch_max:
                            taken, batch = batch, []
                            await handler(taken)
                        continue
                    if suspended():
                        await self.wait_first(callback(message), self.suspend_flow.wait())
                    else:
                        await callback(message)
                    set_read_offset(tp, offset)
                if batch and handler is not None:
                    taken, batch = batch, []
                    await handler(taken)
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)


class LeanProducerBuffer(ProducerBuffer):
    """Faust's producer buffer whose ``size`` knows the producer mode without asking.

    The conductor awaits ``wait_until_ebb`` (which reads ``size``) for every
    consumed message; upstream's ``size`` reads the ``producer_threaded``
    setting each time, several Python calls through Faust's settings registry.
    The mode is fixed for the app's life: :class:`LeanProducer` sets it once.
    """

    threaded = False

    @property
    def size(self) -> int:
        if self.threaded:
            queue = self.queue
            return len(queue._queue) if queue else 0  # type: ignore[attr-defined]
        return len(self.pending._queue)  # type: ignore[attr-defined]


class LeanProducer(faust_aiokafka.Producer):
    """aiokafka-driver producer with :class:`LeanProducerBuffer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the buffer upstream built, answering ``size`` as upstream would
        self.buffer.__class__ = LeanProducerBuffer
        cast(LeanProducerBuffer, self.buffer).threaded = bool(self.app.conf.producer_threaded)


class LeanTransport(faust_aiokafka.Transport):
    """The aiokafka transport with :class:`LeanConsumer` and :class:`LeanProducer`."""

    Consumer = LeanConsumer
    Producer = LeanProducer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_lz4_frame()


def use_lz4_frame() -> bool:
    """Decompress LZ4 record batches with ``lz4.frame`` when it is installed.

    aiokafka decodes LZ4 batches with cramjam, which measured about three
    times slower than ``lz4.frame`` on the same frames (the producers compress
    with LZ4; the output is the same bytes); it was ~5 % of the worker's
    samples under the benchmark. Without the ``lz4`` package nothing changes.
    """
    try:
        decompress = importlib.import_module("lz4.frame").decompress
    except ImportError:
        return False
    for name in _LZ4_USERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "lz4_decode", None) is not None:
            setattr(module, "lz4_decode", decompress)  # noqa: B010 - module attribute
    return True


def _timestamp(item: tuple[Any, Any]) -> Any:
    return item[1].timestamp


class EventTimeAligner(DefaultSchedulingStrategy):
    """Deliver fetched records in timestamp order; hold back what runs ahead.

    ``topics`` are the topics to align (the telemetry topics; others pass
    through untouched). ``lagging`` names the partitions of those topics that
    have unread records but brought none in this fetch: their last delivered
    timestamp bounds the cutoff too (never delivered: everything waits), for
    at most ``max_rounds`` fetches in a row.
    """

    def __init__(
        self,
        app: Any = None,
        topics: frozenset[str] | None = None,
        lagging: Any = None,
        max_held: int = 50_000,
        max_rounds: int = 5,
    ) -> None:
        self.app = app
        self.topics = topics
        self.lagging = lagging  # callable: () -> iterable of TPs with unread records
        self.max_held = max_held
        self.max_rounds = max_rounds
        self.held: dict[Any, list[Any]] = {}
        self.last_ts: dict[Any, int] = {}
        self.rounds = 0
        self._generation: int | None = None

    def iterate(self, records: Mapping[Any, list[Any]]) -> Iterator[tuple[Any, Any]]:
        generation = getattr(self.app, "consumer_generation_id", None)
        if generation != self._generation:
            self.held.clear()
            self.last_ts.clear()
            self._generation = generation
        pending: dict[Any, list[Any]] = self.held
        self.held = {}
        passthrough = []
        for tp, recs in records.items():
            if not recs:
                continue
            if self.topics is not None and tp.topic not in self.topics:
                passthrough.append([(tp, r) for r in recs])
            else:
                pending[tp] = pending[tp] + list(recs) if tp in pending else list(recs)
        cutoffs = self._cutoffs(records, pending)
        streams = passthrough
        for tp, recs in pending.items():
            split = len(recs)
            cutoff = cutoffs.get(_number(tp))
            if cutoff is not None and recs[-1].timestamp > cutoff:
                split = next(i for i, r in enumerate(recs) if r.timestamp > cutoff)
                self.held[tp] = recs[split:]
            if split:
                streams.append([(tp, r) for r in recs[:split]])
                self.last_ts[tp] = recs[split - 1].timestamp
        self.rounds = self.rounds + 1 if self.held else 0
        return heapq.merge(*streams, key=_timestamp)

    def _cutoffs(
        self, records: Mapping[Any, list[Any]], pending: dict[Any, list[Any]]
    ) -> dict[int, float]:
        """Per partition number, the newest timestamp each of its aligned topics has
        reached (none: release all). Only a partition number's topics are aligned with
        each other: each number has a detection core of its own (a job's steps and its
        hosts' samples), and another number's jobs are no reason to wait. Across numbers,
        a job from hosts whose clocks run 2 minutes behind held back every record of a
        job 2 minutes ahead on another partition, which then looked hung while it ran."""
        if (
            not pending
            or not records
            or self.rounds >= self.max_rounds
            or sum(map(len, pending.values())) > self.max_held
        ):
            return {}  # caught up, stuck for too long, or too much held
        fronts: dict[int, list[float]] = {}
        for tp, recs in pending.items():
            fronts.setdefault(_number(tp), []).append(recs[-1].timestamp)
        for tp in self.lagging() if self.lagging is not None else ():
            if tp not in pending and _number(tp) in fronts:
                fronts[_number(tp)].append(self.last_ts.get(tp, -1))
        return {n: min(f) for n, f in fronts.items() if len(f) >= 2}


def _number(tp: Any) -> int:
    """A topic partition's number (co-partitioned topics share it; anything else: 0)."""
    number = getattr(tp, "partition", 0)
    return number if isinstance(number, int) else 0


class RawSchema(faust.Schema[Any, Any]):
    """Events carry the record's key and value bytes as they are: no codec calls.

    The worker decodes values itself (``stepwatch.contract.decode``); Faust's
    serializer pipeline would only copy the bytes through two codec lookups per
    message.
    """

    def compile(self, app: Any, **_: Any) -> Any:
        # what ``app.create_event`` builds, with the event class looked up once: each
        # read of a Faust setting is several Python calls, and this runs per message
        event_type = app.conf.Event

        async def decode(message: Any, *, propagate: bool = False) -> Any:
            return event_type(app, message.key, message.value, message.headers, message)

        return decode


class QuietMonitor(Monitor):
    """Faust's monitor without its per-message bookkeeping.

    The stock monitor timestamps every message in and out of every stream for
    Faust's web statistics page, which the stream worker does not serve; the
    worker's own metrics (``stepwatch.streams.worker.metrics``) count per batch. Commit, send
    and rebalance sensors are kept.
    """

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(
        self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None
    ) -> None:
        return None

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        return None

    def track_tp_end_offset(self, tp: Any, offset: int) -> None:
        return None


async def handle_batch(
    app: Any, messages: list[Any], process: Callable[[list[Any]], Awaitable[None]]
) -> None:
    """One fetch's records of the batch topics, as the conductor and the agent's stream
    handled them one by one.

    Wait while the producer's buffer is over its limit (backpressure). Records fetched
    before a rebalance (an older consumer generation) or while the flow is suspended
    are neither processed nor acknowledged: their offsets stay uncommitted and they
    are read again once the consumer seeks back to the committed offsets (acking
    them let a commit run past records nobody processed). The others are tracked as
    unacknowledged (a rebalance or a shutdown waits for them), processed, and
    acknowledged after ``process`` returned, so offsets are committed only behind
    processed records. Processing is shielded from the cancellation of the fetcher
    task that calls this (a shutdown stops the fetcher first, then waits for tracked
    records): the batch in flight finishes, its outputs are sent and it is
    acknowledged, as the agent's batch was; it is not cut off halfway and sent again
    by the next owner."""
    await app.producer.buffer.wait_until_ebb()
    if not app.flow_control.is_active():
        return
    generation = app.consumer_generation_id
    live = [m for m in messages if m.generation_id == generation]
    if not live:
        return
    consumer = app.consumer
    acking = app.topics.acking_topics
    for message in live:
        if message.topic in acking and not message.tracked:
            message.tracked = True
            consumer.track_message(message)

    async def finish() -> None:
        await process(live)
        for message in live:
            consumer.ack(message)

    task = asyncio.ensure_future(finish())
    _IN_FLIGHT.add(task)  # owned: a shielded task outlives its cancelled awaiter
    task.add_done_callback(lambda t: _finished(t, consumer, live))
    try:
        await asyncio.shield(task)
    except DeliveryAborted:  # not acknowledged, read again after the rebalance
        return  # (raised on, it would stop the fetcher: Faust does not restart it)


#: batches being processed (see handle_batch): a strong reference to each task
_IN_FLIGHT: set[asyncio.Future[None]] = set()


def _finished(task: asyncio.Future[None], consumer: Any, live: list[Any]) -> None:
    """A batch's task ended. If it failed (a bug past ``process``'s own guard) or was
    cancelled (the event loop closing), its records are no longer waited for (a
    shutdown's ``wait_empty`` would wait for them forever) and are not acknowledged:
    read again by the partition's next owner."""
    _IN_FLIGHT.discard(task)
    if not task.cancelled():
        err = task.exception()
        if err is None:
            return
        if isinstance(err, DeliveryAborted):
            log.info("batch left unacknowledged size=%d: %s", len(live), err)
        else:
            log.error("batch failed size=%d error=%r", len(live), err)
    for message in live:
        consumer._unacked_messages.discard(message)
