"""The worker's outputs are delivered before the batch that caused them is acknowledged.

Real parts: the worker's Faust app (``create_app``) and its aiokafka producer, the
development broker, the publisher the worker wires, and a reader of the topics.
A send that fails used to be counted and logged while the batch was acknowledged:
a commit then ran past a detection that never reached the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from stepwatch.contract import Topics
from stepwatch.daemons.broker import DevBroker
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings
from stepwatch.streams.worker.app import StreamOptions, create_app
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Output
from stepwatch.streams.worker.publisher import DeliveryAborted, Publisher, Write
from tests.support.stream_support import read_topic

pytestmark = pytest.mark.integration


def detection(n: int, size: int = 0) -> bytes:
    return json.dumps({"kind": "detection", "id": f"d{n}", "pad": "x" * size}).encode()


class Run:
    """The worker's app with only its producer started, and the publisher it wires."""

    def __init__(self, settings: Settings, tmp_path: Any) -> None:
        self.svc = create_app(settings, StreamOptions(data_dir=str(tmp_path / "data")))
        self.app = self.svc.app
        self.topics = Topics(settings.topic_prefix)
        self.pub = Publisher(
            self.app,
            self.svc.metrics,
            self.svc.store,
            dlq_topic=self.topics.dlq,
            worker="w1",
            retry_first=0.2,
            retry_max=1.0,
        )

    @classmethod
    @contextlib.asynccontextmanager
    async def started(
        cls, settings: Settings, tmp_path: Any, restart: DevBroker | None = None
    ) -> AsyncIterator[Run]:
        """A run with its producer started, stopped on the way out (``restart``: a broker
        the test stopped, started again first)."""
        r = cls(settings, tmp_path)
        await r.app.producer.start()
        try:
            yield r
        finally:
            if restart is not None:
                restart.start()
            await r.app.producer.stop()

    def out(self, n: int, size: int = 0) -> Output:
        return Output(self.topics.detections, b"job", detection(n, size), 0)

    def write(self, n: int) -> list[Write]:
        """What the batch's processing wrote to the ledger (the open of detection n)."""
        self.svc.store.put(f"d{n}".encode(), f"ledger: d{n} open".encode(), 0)
        return self.svc.store.take()

    def errors(self, where: str) -> float:
        return float(self.svc.metrics.errors.labels(where)._value.get())

    @property
    def changelog(self) -> str:
        return str(self.svc.table.changelog_topic.get_topic_name())


def never() -> bool:
    return False


def after(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def ids(settings: Settings) -> list[str]:
    topic = Topics(settings.topic_prefix).detections
    return [json.loads(v)["id"] for _, v in read_topic(settings, topic)]


@pytest.mark.timeout(120)
def test_a_broker_outage_holds_the_batch_until_its_outputs_are_delivered(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    ensure_topics(settings)
    changelog = Run(settings, tmp_path / "name").changelog

    async def run() -> bool:
        async with Run.started(settings, tmp_path) as r:
            await r.pub.publish([r.out(0)], [], never)  # the broker is up: at once
            broker.stop()
            task = asyncio.ensure_future(r.pub.publish([r.out(1), r.out(2)], r.write(1), never))
            await asyncio.sleep(4.0)
            held = not task.done()  # no acknowledgement while the broker is away
            # the timer holds its hang checks meanwhile: the silence is the worker's
            held = held and r.pub.stalled(3.0) and not r.pub.stalled(10.0)
            broker.start()  # the same port, empty (memory storage)
            ensure_topics(settings)
            ensure_topics(settings, [changelog])
            await asyncio.wait_for(task, 60)
            return held and not r.pub.stalled(0.0)

    assert asyncio.run(run())
    # after the restart the broker holds what was sent during the outage, in order,
    # and the ledger's write too
    assert ids(settings) == ["d1", "d2"]
    assert [v for _, v in read_topic(settings, changelog)] == [b"ledger: d1 open"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kept", [True, False], ids=["partition-kept", "partition-moved"])
def test_a_batch_that_stops_being_this_workers_gives_up_and_its_outputs_wait(
    broker: DevBroker, settings: Settings, tmp_path: Any, kept: bool
) -> None:
    """A rebalance or a stop while the broker is away: DeliveryAborted (the batch is
    left unacknowledged), not a return that would ack it. What was not delivered
    waits in the backlog and goes first, output before ledger write, with the next
    publish if the partition stayed with this worker; with a partition that moved
    it is dropped (its new owner reads the batch again), never sent for it."""
    ensure_topics(settings)
    changelog = Run(settings, tmp_path / "name").changelog

    async def run() -> float:
        async with Run.started(settings, tmp_path) as r:
            await r.pub.publish([r.out(0)], [], never)
            broker.stop()
            started = time.monotonic()
            with pytest.raises(DeliveryAborted):
                await r.pub.publish([r.out(1)], r.write(1), after(3.0))
            took = time.monotonic() - started
            broker.start()
            ensure_topics(settings)
            ensure_topics(settings, [changelog])
            r.pub.owned = lambda partition: kept
            await asyncio.wait_for(r.pub.publish([r.out(2)], r.write(2), never), 60)
            return took

    took = asyncio.run(run())
    assert 3.0 <= took < 15.0  # gave up soon after abort() turned true, not before
    entries = [v for _, v in read_topic(settings, changelog)]
    sent = ids(settings)
    # d1, queued in the producer before the abort, may reach the broker when it comes
    # back as well as from the backlog: at-least-once, never after d2
    assert sent[-1] == "d2" and set(sent) <= {"d1", "d2"}, sent
    if kept:
        assert "d1" in sent
        assert entries == [b"ledger: d1 open", b"ledger: d2 open"]
    else:
        assert entries == [b"ledger: d2 open"]


@pytest.mark.timeout(90)
def test_a_publish_waiting_for_its_turn_or_for_the_producers_buffer_can_give_up(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    """The timer's publish holds the turn while the broker is away; a batch behind it
    must still give up when a rebalance comes (the rebalance waits for it), and so
    must one whose sends wait for room in the producer's full buffer."""
    ensure_topics(settings)

    async def run() -> tuple[float, float]:
        async with Run.started(settings, tmp_path, restart=broker) as r:
            await r.pub.publish([r.out(0)], [], never)
            broker.stop()
            first = asyncio.ensure_future(r.pub.publish([r.out(1)], [], after(20.0)))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            with pytest.raises(DeliveryAborted):
                await r.pub.publish([r.out(2)], [], after(1.0))  # behind the first
            behind = time.monotonic() - started
            with pytest.raises(DeliveryAborted):
                await first
            started = time.monotonic()
            many = [r.out(n, size=1024) for n in range(3, 200)]  # past a 16 KiB batch
            with pytest.raises(DeliveryAborted):
                await r.pub.publish(many, [], after(2.0))
            return behind, time.monotonic() - started

    behind, full = asyncio.run(run())
    assert behind < 5.0, behind
    assert full < 8.0, full


@pytest.mark.timeout(90)
def test_an_output_too_large_to_send_becomes_a_dead_letter(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    """The producer refuses a record over its request size: no retry can send it, so
    it goes to the DLQ (reason ``undeliverable``, its head kept) and the batch
    completes; the outputs around it are delivered."""
    ensure_topics(settings)

    async def run() -> float:
        async with Run.started(settings, tmp_path) as r:
            big = r.out(1, size=3 * 1024 * 1024)
            await asyncio.wait_for(r.pub.publish([r.out(0), big, r.out(2)], [], never), 30)
            return r.errors("produce")

    produce_errors = asyncio.run(run())
    assert produce_errors == 1
    assert ids(settings) == ["d0", "d2"]
    letters = [decode_dead_letter(v) for _, v in read_topic(settings, Topics("t").dlq)]
    (letter,) = letters
    assert letter.reason == "undeliverable" and "MessageSizeTooLarge" in letter.detail
    assert letter.topic == Topics("t").detections and letter.offset == -1
    assert letter.payload_truncated and letter.payload.startswith('{"kind": "detection"')
    assert letter.worker == "w1"


@pytest.mark.timeout(90)
def test_a_publish_cancelled_while_waiting_for_its_turn_leaves_the_turn_free(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    """A shutdown cancels a publish queued behind another: the turn it was waiting for
    must not be taken for good by its abandoned wait."""
    ensure_topics(settings)

    async def run() -> str:
        async with Run.started(settings, tmp_path, restart=broker) as r:
            await r.pub.publish([r.out(0)], [], never)
            broker.stop()
            first = asyncio.ensure_future(r.pub.publish([r.out(1)], [], after(4.0)))
            await asyncio.sleep(0.5)
            second = asyncio.ensure_future(r.pub.publish([r.out(2)], [], never))
            await asyncio.sleep(0.5)
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            with pytest.raises(DeliveryAborted):
                await first
            with pytest.raises(DeliveryAborted) as third:
                await asyncio.wait_for(r.pub.publish([r.out(3)], [], after(2.0)), 20)
            return str(third.value)

    assert "turn" not in asyncio.run(run())  # it had its turn, then gave up on the broker
