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

    def log_end(self, tps: Sequence[TP]) -> dict[TP, int]:
        """The high watermark (one past the log's last record) the last fetch of each
        partition gave; partitions not fetched yet are left out.

        Raises :class:`TransportError` when the client cannot say.
        """
        ...

    def lag(self, committed: dict[TP, int]) -> dict[TP, int]: ...

    def resets(self) -> list[TP]:
        """Partitions whose log started again below what was read (it lost records: a
        re-created topic, a restarted memory-only broker) since the last call; the
        next polls read them from where the new log starts."""
        ...

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
        self._suspect: set[TP] = set()  # the statistics put the log's end below _next
        self._resets: list[TP] = []  # logs that went back: for the sink (resets())

    def _stats(self, text: str) -> None:
        """librdkafka statistics: keep each partition's high watermark."""
        try:
            stats = json.loads(text)
            for topic, t in stats.get("topics", {}).items():
                for partition, p in t.get("partitions", {}).items():
                    high = int(p.get("hi_offset", -1))
                    if partition != "-1" and high >= 0:
                        tp = (topic, int(partition))
                        self._high[tp] = high
                        if high < self._next.get(tp, 0):
                            self._suspect.add(tp)
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
        # partitions read again from a gap or a reset: the rest of this poll is not theirs
        skip: set[TP] = self._check_suspects()
        for message in self._consumer.consume(num_messages=max_records, timeout=timeout):
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise TransportError(f"consumer failed: {error}")
                self._warn(f"err-{error.code()}", "consumer error=%s", error, level=logging.WARNING)
                continue
            tp = (str(message.topic()), int(message.partition() or 0))
            offset = int(message.offset() or 0)
            if tp in skip or self._went_back(tp, offset) or self._gap(tp, offset):
                skip.add(tp)
                continue
            out.append(Record(tp[0], tp[1], offset, message.value(), message.key()))
        return out

    def _went_back(self, tp: TP, offset: int) -> bool:
        """True when ``offset`` is below what was read of ``tp`` and no seek asked for it:
        the log started again (librdkafka moved to its start after "offset out of range").
        Read from ``offset`` again once the sink has written what it holds (``resets``)."""
        expected = self._next.get(tp)
        if expected is None or offset >= expected:
            return False
        self._restart(tp, offset, f"offset {offset} after {expected - 1}")
        return True

    def _check_suspects(self) -> set[TP]:
        """Partitions whose log now ends below what was read (the broker kept our
        position): read again from the log's start. Returns the partitions moved."""
        moved: set[TP] = set()
        for tp in sorted(self._suspect):
            self._suspect.discard(tp)
            expected = self._next.get(tp)
            if expected is None:
                continue
            try:
                low, high = self._consumer.get_watermark_offsets(_partition(tp), cached=True)
            except Exception as err:
                self._warn("watermarks", "cannot read the log's bounds error=%s", err)
                continue
            if 0 <= high < expected:
                self._restart(tp, max(0, int(low)), f"log end {high} below {expected}")
                moved.add(tp)
        return moved

    def _restart(self, tp: TP, offset: int, why: str) -> None:
        log.warning(
            "the log lost records (re-created topic, restarted broker) topic=%s partition=%d "
            "%s: reading again from offset %d",
            tp[0],
            tp[1],
            why,
            offset,
        )
        self._consumer.seek(_partition(tp, offset))
        self._next[tp] = offset
        self._resets.append(tp)

    def resets(self) -> list[TP]:
        out, self._resets = self._resets, []
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

    def log_end(self, tps: Sequence[TP]) -> dict[TP, int]:
        from confluent_kafka import TopicPartition

        ends: dict[TP, int] = {}
        for topic, partition in tps:
            try:
                # cached: from fetch responses (a ListOffsets request is not needed, and
                # the development broker answers it with a wrong high watermark)
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), cached=True
                )
            except Exception as err:
                raise TransportError(
                    f"cannot read the log end of {topic}/{partition}: {err}"
                ) from err
            if high is not None and int(high) >= 0:
                ends[(topic, partition)] = int(high)
        return ends

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


def _partition(tp: TP, offset: int | None = None) -> Any:
    from confluent_kafka import TopicPartition

    if offset is None:
        return TopicPartition(tp[0], tp[1])
    return TopicPartition(tp[0], tp[1], offset)
