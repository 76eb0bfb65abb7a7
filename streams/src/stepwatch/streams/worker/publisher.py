"""Outputs to Kafka: delivered before the records that caused them are acknowledged.

The processor's outputs (detections and dead letters) and the ledger's changelog
writes are produced here. :meth:`Publisher.publish` returns only once the broker
has acknowledged every one of them, so the consumer's acknowledgement of a batch
(and so the committed offset) never runs ahead of an output that was lost: a
commit used to pass a detection whose send had failed after the batch was
acknowledged.

A send that fails is sent again, with a growing pause (``retry_first`` doubling
up to ``retry_max`` seconds), for as long as the batch is still this worker's to
finish: the broker's outage or a missing topic stops consumption (the fetcher
waits for the batch) instead of losing what the batch found. When ``abort()``
turns true (a rebalance suspends the flow, the worker stops) it gives up with
:class:`DeliveryAborted`: the batch is then not acknowledged and is read again
by the partition's next owner (outputs of it that did reach the broker may come
again: at-least-once).

An output that no retry can deliver, because of what it is rather than where it
goes (larger than the producer's or the broker's limit), becomes a dead letter
(reason ``undeliverable``, the error, the head of the payload) on the DLQ topic;
a dead letter that cannot be delivered for that reason is counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from stepwatch.errors import TransportError
from stepwatch.logs import LogOnce
from stepwatch.streams.worker.dlq import DlqReason, dead_letter, encode_dead_letter
from stepwatch.streams.worker.metrics import StreamMetrics
from stepwatch.streams.worker.processor import Output

log = logging.getLogger(__name__)

#: errors about the record itself: sending it again cannot succeed
UNDELIVERABLE: tuple[type[BaseException], ...] = (MessageSizeTooLargeError, RecordTooLargeError)
#: how often a wait for acknowledgements asks ``abort`` (seconds)
POLL_SECONDS = 1.0


class DeliveryAborted(TransportError):
    """Outputs were still undelivered when the batch stopped being this worker's."""


class ChangelogStore(Protocol):
    """What the publisher needs of the ledger's store (``app.TableStore``)."""

    pending: list[Any]

    async def flush(self) -> None: ...


class Publisher:
    """Produce outputs and wait for the broker's acknowledgement of each."""

    def __init__(
        self,
        app: Any,
        metrics: StreamMetrics,
        store: ChangelogStore,
        *,
        dlq_topic: str,
        worker: str = "",
        retry_first: float = 0.5,
        retry_max: float = 10.0,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.store = store
        self.dlq_topic = dlq_topic
        self.worker = worker
        self.retry_first = retry_first
        self.retry_max = retry_max
        self.log_once = LogOnce(log)
        self._flushing = asyncio.Lock()  # a batch's publish and the timer's share the queue

    async def publish(self, outputs: Iterable[Output], abort: Callable[[], bool]) -> None:
        """Deliver ``outputs`` in order, then the ledger's queued writes; raise
        :class:`DeliveryAborted` if ``abort()`` turns true first."""
        pending = list(outputs)
        delay = self.retry_first
        while True:
            pending = await self._send(pending, abort)
            if not pending:
                await self._flush_store(abort)
            if not pending and not self.store.pending:
                return
            if abort():
                raise DeliveryAborted(
                    f"{len(pending)} outputs and {len(self.store.pending)} ledger writes "
                    "undelivered when the batch stopped being this worker's"
                )
            await asyncio.sleep(delay)
            delay = min(2 * delay, self.retry_max)

    async def _send(self, outputs: list[Output], abort: Callable[[], bool]) -> list[Output]:
        """Send each output and wait for the acknowledgements; return those to send again
        (an undeliverable one replaced by its dead letter)."""
        sent: list[tuple[Output, Any]] = []
        for out in outputs:
            try:
                future = await self.app.producer.send(
                    out.topic, out.key, out.value, out.partition, None, None
                )
            except Exception as err:  # refused before it was queued
                sent.append((out, err))
            else:
                sent.append((out, future))
        waiting = [f for _, f in sent if not isinstance(f, BaseException)]
        while waiting:
            _, still = await asyncio.wait(waiting, timeout=POLL_SECONDS)
            if still and abort():
                return [out for out, f in sent if f in still or _failed(f)]
            waiting = list(still)
        again: list[Output] = []
        for out, f in sent:
            why = _error(f)
            if why is None:
                continue
            self._count("produce", out, why)
            if _undeliverable(why):
                letter = self._undeliverable(out, why)
                if letter is not None:
                    again.append(letter)
            else:
                again.append(out)
        return again

    async def _flush_store(self, abort: Callable[[], bool]) -> None:
        """The ledger's queued writes (kept queued, in order, when one fails or when
        ``abort()`` turns true while one waits for its acknowledgement)."""
        async with self._flushing:
            await self._flush_queue(abort)

    async def _flush_queue(self, abort: Callable[[], bool]) -> None:
        if not self.store.pending:
            return
        flush = asyncio.ensure_future(self.store.flush())
        while not flush.done():
            await asyncio.wait([flush], timeout=POLL_SECONDS)
            if not flush.done() and abort():
                flush.cancel()
                await asyncio.wait([flush])
                return
        try:
            flush.result()
        except asyncio.CancelledError:
            return
        except Exception as err:
            self.metrics.errors.labels("table").inc()
            self.log_once(
                f"table:{type(err).__name__}",
                "ledger write failed, sent again pending=%d error=%r",
                len(self.store.pending),
                err,
            )

    def _undeliverable(self, out: Output, err: BaseException) -> Output | None:
        """The dead letter that stands for ``out`` (None: ``out`` is one already)."""
        if out.topic == self.dlq_topic:
            self.metrics.errors.labels("output_dropped").inc()
            log.error("dead letter undeliverable, dropped bytes=%d error=%r", len(out.value), err)
            return None
        letter = dead_letter(
            DlqReason.UNDELIVERABLE,
            f"the output could not be produced: {err!r}",
            topic=out.topic,
            partition=out.partition,
            offset=-1,
            key=out.key,
            payload=out.value,
            worker=self.worker,
            now=time.time(),
        )
        return Output(self.dlq_topic, out.key, encode_dead_letter(letter), out.partition)

    def _count(self, where: str, out: Output, err: BaseException) -> None:
        self.metrics.errors.labels(where).inc()
        self.log_once(
            f"{where}:{type(err).__name__}",
            "produce failed (sent again; a dead letter if undeliverable) topic=%s error=%r",
            out.topic,
            err,
        )


def _error(future: Any) -> BaseException | None:
    """Why a send failed (None: acknowledged). A cancelled send failed too."""
    if isinstance(future, BaseException):
        return future
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception()  # type: ignore[no-any-return]


def _undeliverable(err: BaseException) -> bool:
    """``err``, or the error it wraps (Faust raises ``ProducerSendError`` from the
    client's), is about the record itself."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, UNDELIVERABLE):
            return True
        seen = seen.__cause__
    return False


def _failed(future: Any) -> bool:
    return isinstance(future, BaseException) or (future.done() and _error(future) is not None)
