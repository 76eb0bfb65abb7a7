"""The publisher's turn and backlog: order and acknowledgement across publishes.

Real parts: the worker's app from ``create_app`` (not started) and the publisher;
the producer's ``send`` stands for the broker (no broker in a unit test): it
records what was sent and hands back an acknowledgement the test gives when it
chooses. The real-broker cases are in
``tests/integration/streams/worker/test_delivery.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stepwatch.settings import Settings
from stepwatch.streams.worker.app import StreamOptions, create_app
from stepwatch.streams.worker.processor import Output
from stepwatch.streams.worker.publisher import DeliveryAborted, Publisher

pytestmark = pytest.mark.unit


class Broker:
    """``producer.send``: records each value; its acknowledgement waits for ``ack``."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.pending: list[asyncio.Future[None]] = []

    async def send(self, topic: str, key: Any, value: bytes, *args: Any) -> Any:
        self.sent.append(value)
        ack = asyncio.get_running_loop().create_future()
        self.pending.append(ack)
        return ack

    def ack(self) -> None:
        for ack in self.pending:
            if not ack.done():
                ack.set_result(None)


def publisher(tmp_path: Any) -> tuple[Publisher, Broker]:
    svc = create_app(
        Settings.load(env={}, bootstrap_servers="127.0.0.1:9", topic_prefix="p"),
        StreamOptions(data_dir=str(tmp_path)),
    )
    broker = Broker()
    svc.app.producer.send = broker.send
    return Publisher(svc.app, svc.metrics, svc.store, dlq_topic="p.dlq"), broker


def out(value: bytes) -> Output:
    return Output("p.detections", b"job", value, 0)


def never() -> bool:
    return False


def test_a_publish_with_nothing_to_send_waits_for_the_one_under_way(tmp_path: Any) -> None:
    """A batch read again after an abort may have nothing new to send while the timer
    sends what the abort left: it must not be acknowledged before that is delivered."""

    async def run() -> tuple[bool, bool]:
        pub, broker = publisher(tmp_path)
        first = asyncio.ensure_future(pub.publish([out(b"1")], [], never))
        await asyncio.sleep(0.05)
        empty = asyncio.ensure_future(pub.publish([], [], never))
        await asyncio.sleep(0.1)
        early = empty.done()
        broker.ack()
        await asyncio.wait_for(asyncio.gather(first, empty), 5)
        return early, empty.done()

    assert asyncio.run(run()) == (False, True)


def test_units_go_out_in_the_order_they_were_made(tmp_path: Any) -> None:
    """The timer queues for the turn, then a batch queues and gives up (a rebalance):
    the batch's unit waits in the backlog, and when the timer gets the turn the
    timer's older unit goes out before it."""

    async def run() -> list[bytes]:
        pub, broker = publisher(tmp_path)
        holder = asyncio.ensure_future(pub.publish([out(b"holder")], [], never))
        await asyncio.sleep(0.05)
        timer = asyncio.ensure_future(pub.publish([out(b"timer")], [], never))
        await asyncio.sleep(0.05)
        with pytest.raises(DeliveryAborted):
            await pub.publish([out(b"batch")], [], lambda: True)
        broker.ack()  # the holder's acknowledgement: the timer's turn
        for _ in range(50):
            await asyncio.sleep(0.02)
            broker.ack()
        await asyncio.wait_for(asyncio.gather(holder, timer), 5)
        return broker.sent

    assert asyncio.run(run()) == [b"holder", b"timer", b"batch"]


def test_a_turn_that_comes_after_the_abort_sends_nothing(tmp_path: Any) -> None:
    """The turn is free but the batch already stopped being this worker's: its unit
    waits for the next publish, and nothing (the backlog included) goes out for a
    partition that may be moving."""

    async def run() -> tuple[list[bytes], list[bytes]]:
        pub, broker = publisher(tmp_path)
        with pytest.raises(DeliveryAborted):
            await pub.publish([out(b"late")], [], lambda: True)
        before = list(broker.sent)
        nxt = asyncio.ensure_future(pub.publish([out(b"next")], [], never))
        for _ in range(20):
            await asyncio.sleep(0.02)
            broker.ack()
        await asyncio.wait_for(nxt, 5)
        return before, broker.sent

    before, after = asyncio.run(run())
    assert before == []
    assert after == [b"late", b"next"]
