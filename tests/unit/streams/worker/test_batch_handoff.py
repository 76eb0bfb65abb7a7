"""The lean consumer hands each fetch's telemetry records to the processor as one batch.

Real parts: the worker's Faust app as ``create_app`` builds it (lean transport and
consumer, not started), the consumer's own track/ack bookkeeping, aiokafka's
``ConsumerRecord`` turned into a Faust message by the consumer's ``_to_message``,
and the real processor behind ``batch_handler``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from faust.types import TP
from prometheus_client import generate_latest

from stepwatch.contract import KIND_OF, Topics, encode, message_key
from stepwatch.settings import Settings
from stepwatch.sim import Scenario, simulate
from stepwatch.streams.worker import transport
from stepwatch.streams.worker.app import StreamOptions, StreamService, create_app
from stepwatch.streams.worker.processor import Output
from stepwatch.streams.worker.transport import handle_batch

pytestmark = pytest.mark.unit

PREFIX = "hand"


def service(tmp_path: Any, lean: bool = True) -> StreamService:
    settings = Settings.load(
        env={}, bootstrap_servers="127.0.0.1:9", topic_prefix=PREFIX, partitions=2
    )
    return create_app(settings, StreamOptions(data_dir=str(tmp_path), lean_consumer=lean))


async def ready(svc: StreamService) -> Any:
    """The app as after an assignment: topics subscribed (acks on), flow resumed."""
    app = svc.app
    for agent in app.agents.values():
        app.topics.add(agent.channel)  # what the agent does when it starts
    await app.topics._update_indices()  # ... and the conductor when it subscribes
    app.flow_control.resume()
    return app


def records(app: Any, n: int, topic: str = f"{PREFIX}.gpu", first: int = 0) -> list[Any]:
    """``n`` fetched records of one partition, as the consumer builds them."""
    tp = TP(topic, 0)
    return [
        app.consumer._to_message(
            tp,
            ConsumerRecord(
                topic, 0, first + i, int(time.time() * 1000), 0, b"k", b"{}", None, 1, 2, ()
            ),
        )
        for i in range(n)
    ]


def acked(app: Any, topic: str = f"{PREFIX}.gpu") -> list[int]:
    return list(app.consumer._acked[TP(topic, 0)])


def test_the_lean_app_hands_its_telemetry_topics_to_the_batch_handler(tmp_path: Any) -> None:
    lean = service(tmp_path / "lean").app
    assert lean.batch_topics == frozenset(Topics(PREFIX).telemetry())
    assert lean.batch_handler is not None
    assert service(tmp_path / "stock", lean=False).app.batch_handler is None  # stock Faust


def test_records_are_processed_tracked_then_acknowledged(tmp_path: Any) -> None:
    async def run() -> tuple[list[int], list[int], list[int]]:
        app = await ready(service(tmp_path))
        batch = records(app, 5)
        seen: list[int] = []
        before: list[int] = []

        async def process(messages: list[Any]) -> None:
            seen.extend(m.offset for m in messages)
            # while processing: tracked (a rebalance waits for them), none acknowledged
            assert all(m in app.consumer._unacked_messages for m in messages)
            before.extend(acked(app))

        await handle_batch(app, batch, process)
        assert not app.consumer._unacked_messages
        return seen, before, acked(app)

    seen, before, after = asyncio.run(run())
    assert seen == [0, 1, 2, 3, 4]
    assert before == []  # no offset is committable before its record was processed
    assert after == [0, 1, 2, 3, 4]


def test_records_of_an_older_generation_or_while_suspended_are_neither_processed_nor_acked(
    tmp_path: Any,
) -> None:
    """Acking them would let a commit run past records nobody processed. Skipped, they
    stay uncommitted: after the rebalance the consumer seeks back to the committed
    offsets, reads them again, and only then can the commit pass them."""

    async def run() -> tuple[list[int], list[int], int, int | None, int | None]:
        app = await ready(service(tmp_path))
        tp = TP(f"{PREFIX}.gpu", 0)
        seen: list[int] = []

        async def process(messages: list[Any]) -> None:
            seen.extend(m.offset for m in messages)

        fetched = records(app, 3)  # fetched, then a rebalance before they are handled
        app.consumer_generation_id += 1
        await handle_batch(app, fetched, process)
        app.flow_control.suspend()  # a rebalance under way: nothing is processed
        await handle_batch(app, records(app, 2, first=3), process)
        skipped = app.consumer._new_offset(tp)  # what a commit now would write
        app.flow_control.resume()
        await handle_batch(app, records(app, 5), process)  # read again from offset 0
        tracked = len(app.consumer._unacked_messages)
        return seen, acked(app), tracked, skipped, app.consumer._new_offset(tp)

    seen, after, tracked, skipped, committable = asyncio.run(run())
    assert skipped is None  # nothing to commit while the skipped records wait
    assert seen == [0, 1, 2, 3, 4]  # each once, when read again
    assert after == [0, 1, 2, 3, 4]
    assert tracked == 0  # nothing skipped is left for a shutdown to wait on
    assert committable == 5


@pytest.mark.parametrize("error", [RuntimeError, asyncio.CancelledError])
def test_a_batch_that_fails_past_its_guard_is_neither_acked_nor_waited_for(
    tmp_path: Any, error: type[BaseException]
) -> None:
    """A bug after ``process`` (whose own guard catches errors), or the batch's own task
    cancelled (the event loop closing), must not leave tracked records that a
    shutdown's ``wait_empty`` would wait for forever, nor ack them."""

    async def run() -> tuple[list[int], int, int]:
        app = await ready(service(tmp_path))

        async def process(messages: list[Any]) -> None:
            raise error("a bug")

        with pytest.raises(error):
            await handle_batch(app, records(app, 3), process)
        return acked(app), len(app.consumer._unacked_messages), len(transport._IN_FLIGHT)

    assert asyncio.run(run()) == ([], 0, 0)


def test_a_shutdown_lets_the_batch_in_flight_finish(tmp_path: Any) -> None:
    """Stopping the consumer cancels its fetcher task, which runs the batch: the batch
    still finishes (outputs sent, then acknowledged), as the agent's batch did, rather
    than being cut halfway and sent again by the next owner."""

    async def run() -> tuple[list[int], list[int], list[int]]:
        app = await ready(service(tmp_path))
        started, release = asyncio.Event(), asyncio.Event()
        done: list[int] = []

        async def process(messages: list[Any]) -> None:
            started.set()
            await release.wait()  # the outputs being sent
            done.extend(m.offset for m in messages)

        fetcher = asyncio.ensure_future(handle_batch(app, records(app, 4), process))
        await started.wait()
        fetcher.cancel()  # what stopping the consumer does to its fetcher
        with pytest.raises(asyncio.CancelledError):
            await fetcher
        during = acked(app)
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        return during, done, acked(app)

    during, done, after = asyncio.run(run())
    assert during == []  # nothing acknowledged before its outputs were sent
    assert done == [0, 1, 2, 3]
    assert after == [0, 1, 2, 3]


def test_the_handler_feeds_the_real_processor(tmp_path: Any) -> None:
    """``batch_handler`` as the consumer calls it: the records are decoded, admitted and
    counted by the worker's processor, a malformed one is a dead letter, all acknowledged."""

    async def run(svc: StreamService) -> list[int]:
        app = await ready(svc)
        topics = Topics(PREFIX)
        sim = list(
            simulate(Scenario(seed=3, nodes=2, steps=3, job_id="hand-1", start_ts=time.time() - 60))
        )
        gpu = [m for m in sim if topics.for_kind(KIND_OF[type(m)]) == f"{PREFIX}.gpu"][:6]
        batch = records(app, len(gpu) + 1)
        for msg, m in zip(batch, gpu, strict=False):
            msg.key, msg.value = message_key(m), encode(m)
        batch[-1].value = b"{not json"
        sent: list[Any] = []

        async def send(*args: Any) -> asyncio.Future[None]:  # no producer in a unit test
            sent.append(args)
            acknowledged = asyncio.get_running_loop().create_future()
            acknowledged.set_result(None)  # the broker's acknowledgement
            return acknowledged

        app.producer.send = send
        svc.processor.assign([0, 1])
        assert app.batch_handler is not None
        await app.batch_handler(batch)
        assert [a[0] for a in sent] == [topics.dlq]  # the malformed record's dead letter
        return acked(app)

    svc = service(tmp_path)
    assert asyncio.run(run(svc)) == list(range(7))
    text = generate_latest(svc.metrics.registry).decode()
    assert 'stepwatch_stream_messages_total{kind="gpu"} 7.0' in text


T0 = time.time() - 60  # one job's start: the same messages each time they are built


def gpu_batch(app: Any, n: int = 6) -> list[Any]:
    """``n`` fetched records holding valid GPU messages of one job (the same each call)."""
    topics = Topics(PREFIX)
    sim = simulate(Scenario(seed=3, nodes=2, steps=3, job_id="hand-1", start_ts=T0))
    gpu = [m for m in sim if topics.for_kind(KIND_OF[type(m)]) == f"{PREFIX}.gpu"][:n]
    batch = records(app, len(gpu))
    for msg, m in zip(batch, gpu, strict=True):
        msg.key, msg.value = message_key(m), encode(m)
    return batch


def events(svc: StreamService) -> float:
    text = generate_latest(svc.metrics.registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("stepwatch_stream_events_total"))
    return float(line.split()[-1])


def test_an_aborted_batch_is_left_unacked_and_its_outputs_go_first_when_read_again(
    tmp_path: Any,
) -> None:
    """A rebalance while the batch's outputs wait for the broker: the handler returns
    (an exception would stop Faust's fetcher for good) without acknowledging the
    batch. Read again after the rebalance by this worker, which kept the partition
    and its state, the batch's records are duplicates with nothing new to send, but
    it is acknowledged only once the aborted publish's output and ledger write,
    waiting in the publisher's backlog, are delivered, output first."""
    svc = service(tmp_path)

    async def run() -> tuple[list[int], list[int], list[str], bool, float, float]:
        app = await ready(svc)
        svc.processor.assign([0, 1])
        real = svc.processor.process_batch
        sent: list[str] = []

        def with_a_detection(messages: list[Any]) -> list[Any]:
            svc.store.put(b"d1", b"open", 0)
            return [*real(messages), Output(f"{PREFIX}.detections", b"k", b"{}", 0)]

        async def unacknowledged(*args: Any) -> asyncio.Future[None]:  # the broker is away
            return asyncio.get_running_loop().create_future()

        async def acknowledged(topic: str, *args: Any) -> asyncio.Future[None]:
            sent.append(topic)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

        async def changelog(write: Any) -> asyncio.Future[None]:
            return await acknowledged(f"changelog:{write.key.decode()}")

        svc.processor.process_batch = with_a_detection  # type: ignore[method-assign]
        app.producer.send = unacknowledged
        svc.store.send = changelog  # type: ignore[method-assign]
        assert app.batch_handler is not None
        handling = asyncio.ensure_future(app.batch_handler(gpu_batch(app)))
        await asyncio.sleep(0.1)
        app.flow_control.suspend()  # a rebalance begins
        await handling  # returns: the fetcher goes on
        during = acked(app)
        first = events(svc)
        kept = 0 in svc.processor.states and b"d1" in svc.store.table.data
        app.flow_control.resume()
        app.consumer_generation_id += 1
        svc.processor.process_batch = real  # type: ignore[method-assign]
        app.producer.send = acknowledged
        await app.batch_handler(gpu_batch(app))  # read again after the rebalance
        return during, acked(app), sent, kept, first, events(svc)

    during, after, sent, kept, first, again = asyncio.run(run())
    assert during == [] and kept
    assert sent == [f"{PREFIX}.detections", "changelog:d1"]
    assert after == list(range(6))
    assert first > 0 and again == first  # the duplicates were dropped: nothing found twice


def test_a_batch_whose_processing_fails_takes_its_ledger_writes_back(tmp_path: Any) -> None:
    """A bug in the processor after a ledger write: the batch's outputs are gone, so the
    write must not reach the changelog with the next batch's outputs."""
    svc = service(tmp_path)

    async def run() -> tuple[bool, bool, bool]:
        app = await ready(svc)
        svc.processor.assign([0, 1])
        svc.processor.state(0)

        def broken(messages: list[Any]) -> list[Any]:
            svc.store.put(b"d9", b"open", 0)
            raise RuntimeError("a bug")

        svc.processor.process_batch = broken  # type: ignore[method-assign]
        assert app.batch_handler is not None
        await app.batch_handler(records(app, 2))
        return (
            b"d9" not in svc.store.table.data,
            not svc.store.pending,
            0 not in svc.processor.states,
        )

    assert asyncio.run(run()) == (True, True, True)


def test_the_ledger_store_undoes_writes_in_reverse(tmp_path: Any) -> None:
    store = service(tmp_path).store
    store.put(b"a", b"1", 0)
    store.take()  # sent
    store.put(b"a", b"2", 0)
    store.put(b"b", b"1", 1)
    store.delete(b"a", 0)
    store.undo(store.take())
    assert dict(store.table.data) == {b"a": b"1"}
