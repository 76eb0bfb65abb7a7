"""The sink's Kafka side: a confluent-kafka consumer in its own group, manual commits.

Kept behind the small :class:`Source` interface so the sink's batching and
replay logic is tested without a broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from exporters.clickhouse.prepare import Record
from stepwatch.errors import TransportError
from stepwatch.kafka import client_config
from stepwatch.logs import LogOnce
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

TP = tuple[str, int]
Callback = Callable[[list[TP]], None]

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 1000,
    "fetch.min.bytes": 1,
    "queued.max.messages.kbytes": 262144,
}


class Source(Protocol):
    def subscribe(self, topics: Sequence[str], on_assign: Callback, on_revoke: Callback) -> None: ...

    def poll(self, max_records: int, timeout: float) -> list[Record]: ...

    def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        """The committed offset (the next to read) per partition; None when none."""
        ...

    def commit(self, offsets: dict[TP, int]) -> None:
        """Commit ``offsets`` (the next offset to read) synchronously."""
        ...

    def lag(self, committed: dict[TP, int]) -> dict[TP, int]: ...

    def close(self) -> None: ...


class KafkaSource:
    def __init__(self, settings: Settings, group_id: str) -> None:
        from confluent_kafka import Consumer

        config = client_config(settings, {**CONSUMER_DEFAULTS, "group.id": group_id})
        config.setdefault("client.id", f"stepwatch-sink-{settings.host}")
        self.group_id = group_id
        self._consumer = Consumer(config)
        self._warn = LogOnce(log)

    def subscribe(self, topics: Sequence[str], on_assign: Callback, on_revoke: Callback) -> None:
        def assigned(consumer: Any, partitions: list[Any]) -> None:
            on_assign([(p.topic, p.partition) for p in partitions])

        def revoked(consumer: Any, partitions: list[Any]) -> None:
            on_revoke([(p.topic, p.partition) for p in partitions])

        self._consumer.subscribe(list(topics), on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        out: list[Record] = []
        for message in self._consumer.consume(num_messages=max_records, timeout=timeout):
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise TransportError(f"consumer failed: {error}")
                self._warn(f"err-{error.code()}", "consumer error=%s", error, level=logging.WARNING)
                continue
            out.append(Record(message.topic(), message.partition(), message.offset(),
                              message.value(), message.key()))
        return out

    def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        from confluent_kafka import TopicPartition

        if not tps:
            return {}
        try:
            parts = self._consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
        except Exception as err:
            raise TransportError(f"cannot read committed offsets: {err}") from err
        return {(p.topic, p.partition): (p.offset if p.offset >= 0 else None) for p in parts}

    def commit(self, offsets: dict[TP, int]) -> None:
        from confluent_kafka import TopicPartition

        if not offsets:
            return
        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            self._consumer.commit(offsets=parts, asynchronous=False)
        except Exception as err:
            raise TransportError(f"commit failed: {err}") from err

    def lag(self, committed: dict[TP, int]) -> dict[TP, int]:
        from confluent_kafka import TopicPartition

        out: dict[TP, int] = {}
        for (topic, partition), offset in committed.items():
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=1.0, cached=False)
            except Exception as err:
                self._warn("watermarks", "cannot read watermarks error=%s", err)
                continue
            out[(topic, partition)] = max(0, high - max(offset, low))
        return out

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as err:  # closing must never turn a clean stop into a crash
            log.warning("consumer close failed error=%s", err)
