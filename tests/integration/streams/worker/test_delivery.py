"""The worker's outputs are delivered before the batch that caused them is acknowledged.

Real parts: the worker's Faust app (``create_app``) and its aiokafka producer, the
development broker, the publisher the worker wires, and a reader of the topics.
A send that fails used to be counted and logged while the batch was acknowledged:
a commit then ran past a detection that never reached the broker.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from stepwatch.contract import Topics
from stepwatch.daemons.broker import DevBroker
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings
from stepwatch.streams.worker.app import StreamOptions, create_app
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Output
from stepwatch.streams.worker.publisher import DeliveryAborted, Publisher
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
        self.store = NoLedger()
        self.pub = Publisher(
            self.app,
            self.svc.metrics,
            self.store,
            dlq_topic=self.topics.dlq,
            worker="w1",
            retry_first=0.2,
            retry_max=1.0,
        )

    def out(self, n: int, size: int = 0) -> Output:
        return Output(self.topics.detections, b"job", detection(n, size), 0)

    def errors(self, where: str) -> float:
        return float(self.svc.metrics.errors.labels(where)._value.get())


class NoLedger:
    """No ledger writes queued (the publisher flushes them after the outputs)."""

    pending: list[Any] = []

    async def flush(self) -> None:
        return None


def ids(settings: Settings) -> list[str]:
    topic = Topics(settings.topic_prefix).detections
    return [json.loads(v)["id"] for _, v in read_topic(settings, topic)]


@pytest.mark.timeout(120)
def test_a_broker_outage_holds_the_batch_until_its_outputs_are_delivered(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    ensure_topics(settings)

    async def run() -> tuple[bool, float]:
        r = Run(settings, tmp_path)
        await r.app.producer.start()
        try:
            await r.pub.publish([r.out(0)], lambda: False)  # the broker is up: at once
            broker.stop()
            r.svc.store.put(b"d1", b"ledger-entry", 0)  # what the batch wrote to the ledger
            r.pub.store = r.svc.store
            task = asyncio.ensure_future(r.pub.publish([r.out(1), r.out(2)], lambda: False))
            await asyncio.sleep(4.0)
            held = not task.done()  # no acknowledgement while the broker is away
            broker.start()  # the same port, empty (memory storage)
            ensure_topics(settings)
            ensure_topics(settings, [changelog])
            started = time.monotonic()
            await asyncio.wait_for(task, 60)
            return held, time.monotonic() - started
        finally:
            await r.app.producer.stop()

    changelog = Run(settings, tmp_path / "name").svc.table.changelog_topic.get_topic_name()
    held, took = asyncio.run(run())
    assert held
    # after the restart the broker holds what was sent during the outage, in order,
    # and the ledger's write too
    assert ids(settings) == ["d1", "d2"], took
    assert [v for _, v in read_topic(settings, changelog)] == [b"ledger-entry"]


@pytest.mark.timeout(90)
def test_a_batch_that_stops_being_this_workers_gives_up_unacknowledged(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    """A rebalance or a stop while the broker is away: DeliveryAborted (the batch is
    then read again by the partition's next owner), not a return that would ack it."""
    ensure_topics(settings)

    async def run() -> tuple[float, float]:
        r = Run(settings, tmp_path)
        await r.app.producer.start()
        try:
            await r.pub.publish([r.out(0)], lambda: False)
            broker.stop()
            deadline = time.monotonic() + 3.0
            started = time.monotonic()
            with pytest.raises(DeliveryAborted):
                await r.pub.publish([r.out(1)], lambda: time.monotonic() > deadline)
            return time.monotonic() - started, r.errors("produce")
        finally:
            broker.start()
            await r.app.producer.stop()

    took, _ = asyncio.run(run())
    assert 3.0 <= took < 15.0  # gave up soon after abort() turned true, not before


@pytest.mark.timeout(90)
def test_an_output_too_large_to_send_becomes_a_dead_letter(
    broker: DevBroker, settings: Settings, tmp_path: Any
) -> None:
    """The producer refuses a record over its request size: no retry can send it, so
    it goes to the DLQ (reason ``undeliverable``, its head kept) and the batch
    completes; the outputs around it are delivered."""
    ensure_topics(settings)

    async def run() -> float:
        r = Run(settings, tmp_path)
        await r.app.producer.start()
        try:
            big = r.out(1, size=3 * 1024 * 1024)
            await asyncio.wait_for(r.pub.publish([r.out(0), big, r.out(2)], lambda: False), 30)
            return r.errors("produce")
        finally:
            await r.app.producer.stop()

    produce_errors = asyncio.run(run())
    assert produce_errors == 1
    assert ids(settings) == ["d0", "d2"]
    letters = [decode_dead_letter(v) for _, v in read_topic(settings, Topics("t").dlq)]
    (letter,) = letters
    assert letter.reason == "undeliverable" and "MessageSizeTooLarge" in letter.detail
    assert letter.topic == Topics("t").detections and letter.offset == -1
    assert letter.payload_truncated and letter.payload.startswith('{"kind": "detection"')
    assert letter.worker == "w1"
