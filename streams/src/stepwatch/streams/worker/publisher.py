"""Outputs to Kafka: delivered before the records that caused them are acknowledged.

A batch's outputs (detections and dead letters) and the ledger writes its
processing made are produced here. :meth:`Publisher.publish` returns only once
the broker has acknowledged every one of them, so the consumer's
acknowledgement of the batch (and so the committed offset) never runs ahead of
an output that was lost: a commit used to pass a detection whose send had
failed after the batch was acknowledged.

* **Order.** One publish at a time (a batch's or the timer's), in the order their
  processing made them, what an abort left behind included; a publish with
  nothing to send still waits for the one under way (its batch must not be
  acknowledged ahead of earlier outputs). Outputs are sent in order; the ledger
  writes only after every output of the same publish was acknowledged (a
  changelog entry never tells the next owner of a detection nobody was sent),
  one at a time, each acknowledged before the next.
* **Retries.** A failed send is sent again, with a growing pause
  (``retry_first`` doubling up to ``retry_max`` seconds), together with every
  output after it to the same partition (a later one that got through is sent
  again after it, so the last word on a detection stays the last), for as long
  as the batch is still this worker's: the broker's outage or a missing topic
  stops consumption (the fetcher waits for the batch) instead of losing what
  the batch found.
* **Giving up.** Every wait (for the turn, for room in the producer's buffer,
  for an acknowledgement) asks ``abort()`` at least once a second. When it
  turns true (a rebalance suspends the flow, the worker stops)
  :class:`DeliveryAborted` is raised and the batch is left unacknowledged
  (``transport.handle_batch``). What was not delivered waits in the backlog,
  in order, and goes first with the next publish of any caller, for the
  partitions still this worker's (``owned``); that of a partition that moved
  is dropped: its new owner reads the batch again. Records already handed to
  the producer are not recalled (at-least-once).
* **Stalls.** While a publish waits (``stalled``), the timer does not judge
  hangs: no records arrive because the consumer waits for the publish, not
  because the jobs stopped.
* **Undeliverable.** An output that no retry can deliver, because of what it
  is rather than where it goes (larger than the producer's or the broker's
  limit), becomes a dead letter (reason ``undeliverable``, the error, the head
  of the payload) on the DLQ topic; a dead letter or a ledger write that cannot
  be delivered for that reason is counted (``output_dropped``) and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
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
#: how often a wait asks ``abort`` (seconds)
POLL_SECONDS = 1.0

Abort = Callable[[], bool]
#: a stalled publish says so at most this often (seconds)
STALL_LOG_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Write:
    """A changelog write of the ledger, and the table's value before it (to undo it)."""

    key: bytes
    value: bytes | None  # None: a delete
    partition: int
    before: bytes | None


class DeliveryAborted(TransportError):
    """Outputs were still undelivered when the batch stopped being this worker's (what
    was not sent waits in the publisher's backlog)."""


@dataclass
class _Unit:
    """One publish: outputs first, then the ledger writes of the same processing."""

    outputs: list[Output]
    writes: list[Write]
    made: int = 0  # the publish's number: units go out in this order

    @property
    def size(self) -> int:
        return len(self.outputs) + len(self.writes)

    def __bool__(self) -> bool:
        return self.size > 0

    def owned(self, mine: Callable[[int], bool]) -> _Unit:
        return _Unit(
            [o for o in self.outputs if mine(o.partition)],
            [w for w in self.writes if mine(w.partition)],
            self.made,
        )


class ChangelogStore(Protocol):
    """What the publisher needs of the ledger's store (``app.TableStore``)."""

    async def send(self, write: Write) -> Awaitable[Any]: ...


class Publisher:
    """Produce outputs and ledger writes; wait for the broker's acknowledgement of each."""

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
        owned: Callable[[int], bool] = lambda partition: True,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.store = store
        self.dlq_topic = dlq_topic
        self.worker = worker
        self.retry_first = retry_first
        self.retry_max = retry_max
        self.log_once = LogOnce(log)
        self._turn = asyncio.Lock()
        self._since: float | None = None  # when the publish under way began (monotonic)
        self.owned = owned  # partitions still this worker's (the backlog of others is lost)
        self._backlog: list[_Unit] = []  # what aborted publishes did not deliver, in order
        self._made = 0  # publishes asked for so far

    async def publish(
        self, outputs: Iterable[Output], writes: Iterable[Write], abort: Abort
    ) -> None:
        """Deliver the backlog, then ``outputs`` in order, then ``writes``; raise
        :class:`DeliveryAborted` if ``abort()`` turns true first (what was not
        delivered joins the backlog, for the next publish of any caller)."""
        self._made += 1  # no await since the processing that made them: their order
        unit = _Unit(list(outputs), list(writes), self._made)
        if not unit and not self._backlog and not self._turn.locked():
            return  # nothing to send, nothing earlier on its way
        try:
            await self._acquire(abort)
        except DeliveryAborted:
            self._keep([unit])
            raise
        if abort():  # the turn came after the batch stopped being this worker's
            self._keep([unit])
            self._turn.release()
            raise DeliveryAborted("the batch stopped being this worker's at its turn")
        self._since = time.monotonic()
        units = sorted([*self._owned(self._backlog), unit], key=attrgetter("made"))
        self._backlog = []
        try:
            while units:
                await self._unit(units[0], abort)
                units.pop(0)
        except BaseException:
            self._keep(units)
            raise
        finally:
            self._since = None
            self._turn.release()

    def _keep(self, units: list[_Unit]) -> None:
        """Undelivered units into the backlog, in the order they were made."""
        self._backlog = sorted([*self._backlog, *(u for u in units if u)], key=attrgetter("made"))

    def _owned(self, backlog: list[_Unit]) -> list[_Unit]:
        """The backlog of the partitions still this worker's; the rest is lost with them
        (their new owner reads the batches again: at-least-once)."""
        kept = [u.owned(self.owned) for u in backlog]
        lost = sum(u.size for u in backlog) - sum(u.size for u in kept)
        if lost:
            self.metrics.errors.labels("output_dropped").inc(lost)
            log.warning("undelivered outputs of partitions that moved dropped count=%d", lost)
        return [u for u in kept if u]

    async def _unit(self, unit: _Unit, abort: Abort) -> None:
        """A unit's outputs (all again if interrupted), then its writes one by one."""
        await self._outputs(unit.outputs, abort)
        unit.outputs = []
        while unit.writes:
            await self._write(unit.writes[0], abort)
            unit.writes.pop(0)

    def stalled(self, seconds: float) -> bool:
        """A publish has waited longer than ``seconds`` (the broker does not take the
        outputs): the batch handler, and so the consumer, waits with it, and the jobs'
        silence is this worker's, not theirs."""
        return self._since is not None and time.monotonic() - self._since > seconds

    async def _acquire(self, abort: Abort) -> None:
        """Wait for this publish's turn (first come, first served)."""
        if not self._turn.locked():
            await self._turn.acquire()  # free: taken without yielding
            return
        turn = asyncio.ensure_future(self._turn.acquire())
        try:
            if await _wait(turn, abort):
                return
        except BaseException:  # cancelled while waiting: the turn must not be taken
            turn.add_done_callback(self._release_taken)
            turn.cancel()
            raise
        raise DeliveryAborted("the batch stopped being this worker's before its turn")

    def _release_taken(self, turn: asyncio.Future[Any]) -> None:
        if not turn.cancelled() and turn.exception() is None:
            self._turn.release()

    async def _outputs(self, outputs: list[Output], abort: Abort) -> None:
        delay = self.retry_first
        said = time.monotonic()
        while outputs:
            outputs = await self._send(outputs, abort)
            if not outputs:
                return
            if time.monotonic() - said > STALL_LOG_SECONDS:
                said = time.monotonic()
                log.warning(
                    "outputs undelivered for %.0f s, sent again; consumption waits pending=%d",
                    said - (self._since or said),
                    len(outputs),
                )
            await self._pause(delay, abort, f"{len(outputs)} outputs undelivered")
            delay = min(2 * delay, self.retry_max)

    async def _send(self, outputs: list[Output], abort: Abort) -> list[Output]:
        """Send each output and wait for the acknowledgements; return what to send again:
        from each partition's first failure on, an undeliverable one replaced by its
        dead letter."""
        sent = [
            await _queue(
                self.app.producer.send(out.topic, out.key, out.value, out.partition, None, None),
                abort,
                f"{len(outputs)} outputs undelivered",
            )
            for out in outputs
        ]
        acks = [f for f in sent if not isinstance(f, BaseException)]
        if acks and not await _wait_all(acks, abort):
            raise DeliveryAborted(f"{len(outputs)} outputs unacknowledged")
        errors = [_error(f) for f in sent]
        first: dict[tuple[str, int], int] = {}
        for i, (out, why) in enumerate(zip(outputs, errors, strict=True)):
            if why is not None and not _undeliverable(why):
                first.setdefault((out.topic, out.partition), i)
        again: list[Output] = []
        for i, (out, why) in enumerate(zip(outputs, errors, strict=True)):
            if why is not None:
                self._count("produce", out.topic, why)
                if _undeliverable(why):
                    letter = self._dead_letter(out, why)
                    again.extend([letter] if letter is not None else [])
                    continue
            if i >= first.get((out.topic, out.partition), len(outputs)):
                again.append(out)
        return again

    async def _write(self, write: Write, abort: Abort) -> None:
        """One ledger write, sent until acknowledged (dropped if undeliverable)."""
        delay = self.retry_first
        while True:
            ack = await _queue(self.store.send(write), abort, "a ledger write undelivered")
            if not isinstance(ack, BaseException) and not await _wait(ack, abort):
                raise DeliveryAborted("a ledger write unacknowledged")
            why = _error(ack)
            if why is None:
                return
            self._count("table", "changelog", why)
            if _undeliverable(why):
                self._dropped(f"ledger write key={write.key!r}", why)
                return
            await self._pause(delay, abort, "a ledger write undelivered")
            delay = min(2 * delay, self.retry_max)

    async def _pause(self, seconds: float, abort: Abort, what: str) -> None:
        """The pause before sending again; give up instead if ``abort()`` is true."""
        end = time.monotonic() + seconds
        while True:
            if abort():
                raise DeliveryAborted(f"{what} when the batch stopped being this worker's")
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, POLL_SECONDS))

    def _dead_letter(self, out: Output, err: BaseException) -> Output | None:
        """The dead letter that stands for ``out`` (None: ``out`` is one already)."""
        if out.topic == self.dlq_topic:
            self._dropped(f"dead letter of {len(out.value)} bytes", err)
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

    def _dropped(self, what: str, err: BaseException) -> None:
        self.metrics.errors.labels("output_dropped").inc()
        log.error("undeliverable, dropped: %s error=%r", what, err)

    def _count(self, where: str, topic: str, err: BaseException) -> None:
        self.metrics.errors.labels(where).inc()
        self.log_once(
            f"{where}:{type(err).__name__}",
            "produce failed (sent again; a dead letter if undeliverable) topic=%s error=%r",
            topic,
            err,
        )


async def _wait(future: asyncio.Future[Any], abort: Abort) -> bool:
    """Wait for ``future``, asking ``abort()`` every second; on abort cancel it and
    return False (a cancelled ``Lock.acquire`` leaves the lock to the next waiter)."""
    while not future.done():
        await asyncio.wait([future], timeout=POLL_SECONDS)
        if not future.done() and abort():
            future.cancel()
            await asyncio.wait([future])
            return False
    return True


async def _wait_all(futures: list[Any], abort: Abort) -> bool:
    """Wait for every acknowledgement, asking ``abort()`` every second (False: aborted;
    the sends stay queued in the producer)."""
    waiting = list(futures)
    while waiting:
        _, still = await asyncio.wait(waiting, timeout=POLL_SECONDS)
        if still and abort():
            return False
        waiting = list(still)
    return True


async def _queue(send: Awaitable[Any], abort: Abort, what: str) -> Any:
    """Hand a record to the producer (which may wait for room in its buffer): the
    future of its acknowledgement, or the error that refused it. The abortable wait (an
    ``asyncio.wait`` with a timer) only when the send did not finish in its first step:
    made for every output it was most of a dead letter's cost (78-83 µs of CPU per
    output against 34-50 µs without, 20,000 outputs in publishes of 400 to the
    development broker, timed by a throwaway script)."""
    task = asyncio.ensure_future(send)
    await asyncio.sleep(0)  # its first step: with room in the buffer, the send is done
    if not task.done() and not await _wait(task, abort):
        raise DeliveryAborted(what)
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()


def _error(future: Any) -> BaseException | None:
    """Why a send failed (None: acknowledged): the error itself, or the acknowledgement's.
    A cancelled send failed too."""
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
