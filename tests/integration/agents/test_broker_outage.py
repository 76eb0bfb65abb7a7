"""Kafka down for 30 s, then back on the same port: nothing lost, order kept.

The agent (real steps socket, real publisher and spool, the replayed NVML
collector when this build has it) keeps ticking through the outage while a
fake rank keeps sending steps. The development broker keeps data in memory
only, so the consumer reads everything produced before the stop first, and
everything after the restart with a fresh consumer from the beginning.
Sequence numbers then prove it: every (host, inst, kind) stream is contiguous
from 0, first deliveries are in order within each partition; duplicates (the
at-least-once retries) are counted and reported.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from stepwatch.agents.agent import Agent, build_collectors
from stepwatch.agents.publisher import BrokerState, KafkaPublisher
from stepwatch.audit import SeqAudit
from stepwatch.contract import KIND_OF, Message, StepMessage, StepRecord, Topics, decode
from stepwatch.contract.wire import RankStep, encode_datagram
from stepwatch.daemons.broker import DevBroker
from stepwatch.errors import StepwatchError
from stepwatch.settings import Settings

OUTAGE_SECONDS = 30.0
TICK = 0.25
Delivered = tuple[str, int, int, Message]  # topic, partition, offset, message


class Reader:
    """Assign every partition of the telemetry topics from the beginning; read on demand."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"o-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        meta = self.consumer.list_topics(timeout=10).topics
        self.consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        )
        self.got: list[Delivered] = []

    def read_until(self, want: int, timeout: float) -> list[Delivered]:
        deadline = time.monotonic() + timeout
        while len(self.got) < want and time.monotonic() < deadline:
            for msg in self.consumer.consume(num_messages=1000, timeout=0.3):
                if msg.error() is None:
                    self.got.append(
                        (
                            msg.topic() or "",
                            msg.partition() or 0,
                            msg.offset() or 0,
                            decode(msg.value() or b""),
                        )
                    )
        return self.got

    def close(self) -> None:
        self.consumer.close()


class Rank(threading.Thread):
    """A training rank sending one step datagram every 50 ms until stopped."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path, self.sent, self.stop = path, 0, threading.Event()

    def run(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            while not self.stop.wait(0.05):
                now = time.time()
                rec = StepRecord(
                    job_id="job-o", rank=0, world_size=8, step=self.sent, start=now - 0.05, end=now
                )
                sock.sendto(encode_datagram(RankStep(step=rec)), self.path)
                self.sent += 1


def tick_for(agent: Agent, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        agent.tick()
        time.sleep(TICK)


def produced(agent: Agent) -> int:
    return sum(agent.snapshot().messages.values())


@pytest.mark.timeout(180)
def test_thirty_second_outage_loses_nothing(broker: DevBroker, settings: Settings) -> None:
    settings = settings.replace(collectors="steps,nvml-replay")
    try:
        collectors = build_collectors(settings)
    except StepwatchError:
        collectors = build_collectors(settings.replace(collectors="steps"))
    publisher = KafkaPublisher(settings, probe_timeout=1.0)
    agent = Agent(settings, collectors, publisher)
    rank = Rank(settings.agent_socket)
    topics = list(Topics(settings.topic_prefix).telemetry())
    rank.start()
    try:
        # phase 1: normal running; then everything delivered and read before the stop
        tick_for(agent, 3.0)
        assert publisher.flush(20) == 0
        before = Reader(broker.bootstrap, topics)
        phase1 = list(before.read_until(produced(agent), timeout=20))
        before.close()
        assert len(phase1) == produced(agent)

        # phase 2: the broker goes away; the agent keeps ticking (the first records
        # are produced before the client notices: in flight when the broker died)
        broker.stop()
        tick_for(agent, OUTAGE_SECONDS)
        during = publisher.stats()
        assert during.state is BrokerState.DOWN
        assert during.spool.records > 0 and during.spool.dropped.get("bound", 0) == 0

        # phase 3: back on the same port, empty (memory storage): catch up, keep running
        broker.start()
        tick_for(agent, 3.0)
        rank.stop.set()
        rank.join()
        agent.tick()
        assert publisher.flush(60) == 0
        total = produced(agent)
        after = Reader(broker.bootstrap, topics)
        phase2 = after.read_until(total - len(phase1), timeout=30)
        time.sleep(1.0)  # let any duplicate stragglers arrive too
        phase2 = after.read_until(10**9, timeout=1.0)
        after.close()
        stats = publisher.stats()
    finally:
        rank.stop.set()
        agent.shutdown(timeout=5)

    audit = SeqAudit()
    for *_, m in phase1 + phase2:
        audit.add(m)
    report = audit.report()
    print(
        f"\noutage report: produced={total} delivered={len(phase1) + len(phase2)} "
        f"missing={report.missing} duplicates={report.duplicates} "
        f"spooled_at_restart={during.spool.records} producer_resets={stats.producer_resets} "
        f"delivery_failures={stats.delivery_failures}"
    )
    assert report.messages == total  # every message, once at least
    assert report.missing == 0
    assert in_order(phase1) and in_order(phase2)
    assert report.duplicates == len(phase1) + len(phase2) - total
    assert stats.producer_resets >= 1 and stats.spool.records == 0
    steps = sorted(
        r.step for *_, m in phase1 + phase2 if isinstance(m, StepMessage) for r in m.steps
    )
    assert steps == sorted(set(steps)) == list(range(rank.sent))  # every step, once
    partitions = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert {len(partitions.topics[t].partitions) for t in topics} == {settings.partitions}


def in_order(delivered: list[Delivered]) -> bool:
    """Within each partition, first deliveries of each stream come in sequence order."""
    last: dict[tuple[str, int, str, str, str], int] = {}
    seen: set[tuple[str, str, str, int]] = set()
    for topic, part, _offset, m in sorted(delivered, key=lambda d: (d[0], d[1], d[2])):
        kind = KIND_OF[type(m)].value
        if (m.host, m.inst, kind, m.seq) in seen:
            continue
        seen.add((m.host, m.inst, kind, m.seq))
        key = (topic, part, m.host, m.inst, kind)
        if m.seq < last.get(key, -1):
            return False
        last[key] = m.seq
    return True


def test_order_check_can_fail() -> None:
    """in_order() catches a reordering, so the outage test can fail on order."""
    from stepwatch.contract import GpuMessage

    msgs = [GpuMessage(host="h", ts=1.0, inst="i", seq=s) for s in (0, 2, 1)]
    assert not in_order([("t", 0, i, m) for i, m in enumerate(msgs)])
    assert in_order([("t", 0, i, m) for i, m in enumerate(sorted(msgs, key=lambda m: m.seq))])
