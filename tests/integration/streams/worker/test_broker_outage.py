"""The broker stops answering for 15 s while a job trains: not a hang of every job.

A real worker reads a job that reports a step every 0.25 s (hang limit 4 s). The
broker is frozen (SIGSTOP: a broker that stops answering, as one lost to the
network or a long pause does; its data stays) for 15 s while the job's producer
keeps queueing steps, as an agent's client does, then thawed (SIGCONT). Before,
the worker's clock ran on through the outage and the job was called hung (the
detection was published when the broker came back, then resolved: a page, and an
input to remediation). Now the partitions count as unread, nothing opens, and a
real hang after the outage still opens within the limit.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from confluent_kafka import Producer

from stepwatch.contract import StepMessage, StepRecord, Topics, encode, message_key
from stepwatch.daemons.broker import DevBroker
from stepwatch.kafka import ensure_topics, producer_config
from stepwatch.settings import Settings
from tests.support.stream_support import StreamWorker, read_topic, wait_for

pytestmark = pytest.mark.integration

STEP = 0.25
HANG_LIMIT = 4.0
UNREAD = 2.0
OUTAGE = 15.0


class Job(threading.Thread):
    """A 4-rank job on 2 hosts: one step message per host every STEP, queued in one
    producer without waiting for the broker (as an agent's client queues)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.topic = Topics(settings.topic_prefix).steps
        self.producer = Producer(producer_config(settings, **{"linger.ms": 5}))
        self.running = threading.Event()
        self.running.set()
        self.done = threading.Event()
        self.step = 0

    def run(self) -> None:
        while not self.done.is_set():
            if self.running.is_set():
                self._send(time.time())
                self.step += 1
            self.producer.poll(0)
            time.sleep(STEP)
        self.producer.flush(30)

    def _send(self, now: float) -> None:
        for h in range(2):
            msg = StepMessage(
                host=f"h{h}",
                ts=now,
                job_id="j",
                steps=[
                    StepRecord(
                        job_id="j",
                        rank=2 * h + r,
                        world_size=4,
                        step=self.step,
                        start=now - STEP,
                        end=now - 0.001 * r,
                        host=f"h{h}",
                    )
                    for r in range(2)
                ],
            )
            self.producer.produce(
                self.topic, encode(msg), key=message_key(msg), timestamp=int(now * 1000)
            )


def opened(settings: Settings) -> list[str]:
    topic = Topics(settings.topic_prefix).detections
    docs = [json.loads(v) for _, v in read_topic(settings, topic)]
    return [d["type"] for d in docs if d["state"] == "open"]


def training(settings: Settings, tmp_path) -> tuple[StreamWorker, Job]:  # type: ignore[no-untyped-def]
    """A ready worker (hang limit HANG_LIMIT, unread after UNREAD) reading a training job."""
    ensure_topics(settings)
    env = {
        "STEPWATCH_HANG_MIN_SECONDS": str(HANG_LIMIT),
        "STEPWATCH_STREAM_UNREAD_SECONDS": str(UNREAD),
    }
    worker = StreamWorker(settings, tmp_path, "w", env=env).start()
    job = Job(settings)
    try:
        wait_for("worker ready", lambda: worker.value("stepwatch_stream_ready") >= 1, 60, [worker])
        job.start()
        wait_for(
            "steps read",
            lambda: worker.value("stepwatch_stream_messages_total") >= 40,
            30,
            [worker],
        )
    except BaseException:
        job.done.set()
        worker.stop()
        raise
    return worker, job


@pytest.mark.timeout(180)
def test_a_frozen_broker_is_no_hang_and_a_real_hang_after_it_still_is(
    broker: DevBroker, settings: Settings, tmp_path
) -> None:
    worker, job = training(settings, tmp_path)
    try:
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            unread = wait_for(
                "partitions unread",
                lambda: worker.value("stepwatch_stream_unread_partitions"),
                OUTAGE,
                [worker],
            )
            time.sleep(max(0.0, OUTAGE - UNREAD - 2))
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert unread >= 1  # type: ignore[operator]
        sent = 2 * job.step
        wait_for(  # the steps queued through the outage, and more
            "the backlog read",
            lambda: worker.value("stepwatch_stream_messages_total") >= sent + 8,
            60,
            [worker],
        )
        time.sleep(HANG_LIMIT + 2)  # ticks after the backlog: a hang would be out
        assert opened(settings) == [], "a detection opened for a job that trained on"
        assert worker.value("stepwatch_stream_unread_partitions") == 0
        job.running.clear()  # the job really hangs now
        stopped = time.time()
        wait_for("the real hang", lambda: "hang" in opened(settings), 30, [worker])
        assert time.time() - stopped < HANG_LIMIT + 10
        assert opened(settings) == ["hang"]
        assert "partition input read again" in worker.log
    finally:
        job.done.set()
        assert worker.stop() == 0, worker.log[-3000:]


@pytest.mark.timeout(180)
def test_a_frozen_worker_is_no_hang(broker: DevBroker, settings: Settings, tmp_path) -> None:
    """The worker itself stops for 15 s (a frozen VM, a SIGSTOP) while the broker and the
    job go on. Before (review): when it woke, its aiokafka thread could take a fetch
    answer before the timer ran, and the job was called hung. Its timer now sees the
    gap between ticks and counts it as unread."""
    worker, job = training(settings, tmp_path)
    try:
        assert worker.proc is not None
        os.kill(worker.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(OUTAGE)
        finally:
            os.kill(worker.proc.pid, signal.SIGCONT)
        sent = 2 * job.step
        wait_for(
            "the steps sent meanwhile read",
            lambda: worker.value("stepwatch_stream_messages_total") >= sent + 8,
            60,
            [worker],
        )
        time.sleep(HANG_LIMIT + 2)
        assert opened(settings) == [], "a detection opened for a job that trained on"
        assert "partition input read again" in worker.log
    finally:
        job.done.set()
        assert worker.stop() == 0, worker.log[-3000:]
