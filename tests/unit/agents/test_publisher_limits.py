"""Records Kafka refuses for good: dead-lettered, never retried forever, never blocking the rest."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from stepwatch.agents.publisher import KafkaPublisher
from stepwatch.agents.sink import Sequencer
from stepwatch.agents.spool import Spool
from stepwatch.contract import KIND_OF, StepMessage, StepRecord, Topics, encode, message_key
from tests.unit.agents.test_publisher import (
    Err,
    FakeCluster,
    FakeProducer,
    messages,
    received,
    settings,
)

NOW = time.time()


def big_step(n_records: int, seq: Sequencer) -> StepMessage:
    recs = [
        StepRecord(
            job_id="job-1", rank=i % 8, world_size=8, step=i, start=NOW - 1, end=NOW, host="h"
        )
        for i in range(n_records)
    ]
    return seq.stamp(StepMessage(host="h", ts=NOW, job_id="job-1", steps=recs))  # type: ignore[return-value]


class ClientLimitProducer(FakeProducer):
    """librdkafka's own check: produce() raises MSG_SIZE_TOO_LARGE for a value over 1 MB."""

    def produce(
        self, topic: str, value: bytes, key: bytes, on_delivery: Any, timestamp: int = 0
    ) -> None:
        if len(value) > 1_000_000:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        super().produce(topic, value, key, on_delivery, timestamp)


class BatchLimitProducer(FakeProducer):
    """A broker whose batch limit is 100 kB: refuses whole batches while batch.size is larger."""

    def poll(self, timeout: float = 0) -> int:
        if int(self.config.get("batch.size", 1_000_000)) > 100_000 and self.queue:
            items, self.queue = self.queue, []
            for *_, cb in items:
                cb(Err("MSG_SIZE_TOO_LARGE"), None)
            return len(items)
        return super().poll(timeout)


def use(cluster: FakeCluster, cls: type[FakeProducer]) -> None:
    def factory(config: dict[str, Any]) -> FakeProducer:
        producer = cls(cluster, config)
        cluster.producers.append(producer)
        return producer

    cluster.factory = factory  # type: ignore[method-assign]


def publisher(tmp_path: Path, cluster: FakeCluster, **kw: Any) -> KafkaPublisher:
    return KafkaPublisher(
        settings(tmp_path, **kw), producer_factory=cluster.factory, probe=cluster.probe
    )


def dead_files(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "spool" / "dead").glob("*.json"))]


def test_record_over_the_limit_is_dead_lettered_not_retried(tmp_path: Path) -> None:
    cluster = FakeCluster()
    pub = publisher(tmp_path, cluster, max_message_bytes=64 * 1024)
    seq = Sequencer("inst0")
    before, poison, after = messages(3, seq=seq), big_step(2000, seq), messages(3, seq=seq)
    pub.send([*before, poison, *after])
    try:
        assert pub.flush(5) == 0
        stats = pub.stats()
    finally:
        pub.close(timeout=1)
    assert len(cluster.delivered) == 6 and len(cluster.producers) == 1  # no reset, no retry
    assert stats.dead_letters == {"too_large": 1} and stats.producer_resets == 0
    [dead] = dead_files(tmp_path)
    assert dead["reason"] == "too_large" and dead["bytes"] == len(encode(poison))


def test_client_side_size_refusal_does_not_wedge_the_sender(tmp_path: Path) -> None:
    cluster = FakeCluster()
    use(cluster, ClientLimitProducer)
    pub = publisher(tmp_path, cluster, max_message_bytes=8 * 1024 * 1024)  # only the client limits
    seq = Sequencer("inst0")
    pub.send([big_step(9000, seq), *messages(4, seq=seq)])
    try:
        assert pub.flush(5) == 0
        stats = pub.stats()
    finally:
        pub.close(timeout=1)
    assert len(cluster.delivered) == 4 and stats.dead_letters == {"too_large": 1}
    assert stats.producer_resets == 0 and stats.rewinds == 0


def test_batch_refused_as_too_large_is_halved_until_it_passes(tmp_path: Path) -> None:
    cluster = FakeCluster()
    use(cluster, BatchLimitProducer)
    pub = publisher(tmp_path, cluster)
    msgs = messages(50)
    pub.send(msgs)
    try:
        assert pub.flush(10) == 0
        stats = pub.stats()
    finally:
        pub.close(timeout=1)
    assert sorted(received(cluster)) == sorted(
        {(f"{m.host}/{m.inst}/{type(m).__name__}", m.seq) for m in msgs}
    )
    assert stats.batch_splits == 4 and not stats.dead_letters  # 1 MB -> 62.5 kB
    assert int(cluster.producers[-1].config["batch.size"]) <= 100_000


def test_poison_record_in_an_old_spool_is_passed_on_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 64 * 1024 * 1024)
    seq = Sequencer("inst0")
    poison = big_step(9000, seq)
    topics = Topics("t")
    rest = messages(5, seq=seq)
    spool.append([(topics.steps, message_key(poison), encode(poison), 0)])
    spool.append([(topics.for_kind(KIND_OF[type(m)]), message_key(m), encode(m), 0) for m in rest])
    spool.close()
    cluster = FakeCluster()
    pub = publisher(tmp_path, cluster)
    try:
        assert pub.flush(5) == 0
        stats = pub.stats()
    finally:
        pub.close(timeout=1)
    assert len(cluster.delivered) == 5 and stats.dead_letters == {"too_large": 1}
    assert not Spool(tmp_path / "spool", 64 * 1024 * 1024).pending()


def test_dead_letters_are_bounded(tmp_path: Path) -> None:
    cluster = FakeCluster()
    pub = publisher(
        tmp_path, cluster, max_message_bytes=8 * 1024, agent_dead_letter_max_bytes=64 * 1024
    )
    seq = Sequencer("inst0")
    pub.send([big_step(200, seq) for _ in range(40)])
    try:
        assert pub.flush(5) == 0
    finally:
        pub.close(timeout=1)
    files = list((tmp_path / "spool" / "dead").glob("*.json"))
    assert pub.dead.counts["too_large"] == 40
    assert sum(f.stat().st_size for f in files) <= 64 * 1024 and pub.dead.evicted > 0
