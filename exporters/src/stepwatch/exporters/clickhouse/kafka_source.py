"""The sink's Kafka side: a confluent-kafka consumer in its own group, manual commits.

Kept behind the small :class:`Source` interface so the sink's batching and
replay logic is tested without a broker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from stepwatch.errors import TransportError
from stepwatch.exporters.clickhouse.prepare import Record
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
    "statistics.interval.ms": 5000,  # high watermarks for the lag gauge, without extra requests
}


class Source(Protocol):
    def subscribe(
        self, topics: Sequence[str], on_assign: Callback, on_revoke: Callback
    ) -> None: ...

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

        config = client_config(settings, {**CONSUMER_DEFAULTS, "group.id": group_id}, role="sink")
        config.setdefault("client.id", f"stepwatch-sink-{settings.host}")
        config["stats_cb"] = self._stats
        self.group_id = group_id
        self._high: dict[TP, int] = {}
        self._consumer = Consumer(config)
        self._warn = LogOnce(log)
        self._next: dict[TP, int] = {}  # the offset expected next per partition (gap check)
        self._reread: set[tuple[TP, int]] = set()  # gaps already read again once
        self.offset_gaps = 0  # gaps that stayed after reading them again

    def _stats(self, text: str) -> None:
        """librdkafka statistics: keep each partition's high watermark."""
        try:
            stats = json.loads(text)
            for topic, t in stats.get("topics", {}).items():
                for partition, p in t.get("partitions", {}).items():
                    high = int(p.get("hi_offset", -1))
                    if partition != "-1" and high >= 0:
                        self._high[(topic, int(partition))] = high
        except (ValueError, TypeError, AttributeError) as err:
            self._warn("stats", "unreadable consumer statistics error=%s", err)

    def subscribe(self, topics: Sequence[str], on_assign: Callback, on_revoke: Callback) -> None:
        def assigned(consumer: Any, partitions: list[Any]) -> None:
            self._forget([(p.topic, p.partition) for p in partitions])
            on_assign([(p.topic, p.partition) for p in partitions])

        def revoked(consumer: Any, partitions: list[Any]) -> None:
            self._forget([(p.topic, p.partition) for p in partitions])
            on_revoke([(p.topic, p.partition) for p in partitions])

        self._consumer.subscribe(
            list(topics), on_assign=assigned, on_revoke=revoked, on_lost=revoked
        )

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        out: list[Record] = []
        skip: set[TP] = (
            set()
        )  # partitions read again from a gap: the rest of this poll is not theirs
        for message in self._consumer.consume(num_messages=max_records, timeout=timeout):
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise TransportError(f"consumer failed: {error}")
                self._warn(f"err-{error.code()}", "consumer error=%s", error, level=logging.WARNING)
                continue
            tp = (str(message.topic()), int(message.partition() or 0))
            offset = int(message.offset() or 0)
            if tp in skip or self._gap(tp, offset):
                skip.add(tp)
                continue
            out.append(Record(tp[0], tp[1], offset, message.value(), message.key()))
        return out

    def _gap(self, tp: TP, offset: int) -> bool:
        """True when ``offset`` skips records of ``tp`` not seen yet: the partition is read
        again from the first missing offset, once per gap (a gap that is still there then,
        as compaction or transaction markers leave, is logged and accepted)."""
        expected = self._next.get(tp)
        self._next[tp] = offset + 1
        if expected is None or offset <= expected:
            return False
        if (tp, expected) not in self._reread:
            from confluent_kafka import TopicPartition

            self._reread.add((tp, expected))
            log.warning(
                "offset gap topic=%s partition=%d expected=%d got=%d: reading again",
                tp[0],
                tp[1],
                expected,
                offset,
            )
            self._consumer.seek(TopicPartition(tp[0], tp[1], expected))
            self._next[tp] = expected
            return True
        self.offset_gaps += 1
        log.warning(
            "offset gap stayed topic=%s partition=%d from=%d to=%d (%d offsets without records)",
            tp[0],
            tp[1],
            expected,
            offset - 1,
            offset - expected,
        )
        return False

    def _forget(self, tps: list[TP]) -> None:
        for tp in tps:
            self._next.pop(tp, None)

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
        """Records past the committed offset, from the last statistics (no broker request)."""
        return {
            tp: max(0, self._high[tp] - offset)
            for tp, offset in committed.items()
            if tp in self._high
        }

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as err:  # closing must never turn a clean stop into a crash
            log.warning("consumer close failed error=%s", err)
