"""The sink's consumer reads a partition again from an offset gap, once per gap.

A broker that skips a record in a fetch (never seen on a real cluster; a gap
of offsets is legal only where compaction or transaction markers leave one)
would otherwise lose it silently. No broker here skips on demand, so the
librdkafka consumer is replaced by a stand-in that delivers what a fetch
would; everything else is the real :class:`KafkaSource`.
"""

from __future__ import annotations

from typing import Any

import pytest

from stepwatch.exporters.clickhouse.kafka_source import KafkaSource

pytestmark = pytest.mark.unit


class Msg:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t.steps"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def key(self) -> bytes:
        return b""


class Log:
    """Offsets 0..n-1 of one partition; ``skip`` is left out of the first fetch past it."""

    def __init__(self, n: int, skip: set[int], always: bool = False) -> None:
        self.n, self.skip, self.always = n, skip, always
        self.pos = 0
        self.seeks: list[int] = []

    def consume(self, num_messages: int, timeout: float) -> list[Msg]:
        out = []
        while self.pos < self.n and len(out) < num_messages:
            if self.pos in self.skip:
                if not self.always:
                    self.skip.discard(self.pos)
                self.pos += 1
                continue
            out.append(Msg(self.pos))
            self.pos += 1
        return out

    def seek(self, tp: Any) -> None:
        self.seeks.append(tp.offset)
        self.pos = tp.offset


def source(log: Log) -> KafkaSource:
    src = KafkaSource.__new__(KafkaSource)
    src._consumer = log
    src._next, src._reread, src.offset_gaps = {}, set(), 0
    src._suspect, src._resets = set(), []
    return src


def drain(src: KafkaSource) -> list[int]:
    got: list[int] = []
    for _ in range(10):
        got += [r.offset for r in src.poll(4, 0.0)]
    return got


def test_a_record_skipped_by_a_fetch_is_read_again() -> None:
    log = Log(10, {5})
    src = source(log)
    assert drain(src) == list(range(10))
    assert log.seeks == [5] and src.offset_gaps == 0


def test_a_gap_that_stays_is_accepted_once_and_counted() -> None:
    log = Log(10, {3, 4}, always=True)  # compaction left no records there
    src = source(log)
    assert drain(src) == [0, 1, 2, 5, 6, 7, 8, 9]
    assert log.seeks == [3] and src.offset_gaps == 1


def test_a_log_that_starts_again_is_read_from_its_start_and_reported() -> None:
    """librdkafka moves to the log's start after "offset out of range" (a re-created
    topic): offsets go back with no seek of ours. The source seeks there and reports the
    partition, so the sink does not drop the new log's records as re-deliveries."""
    log = Log(10, set())
    src = source(log)
    assert drain(src) == list(range(10))
    log.n, log.pos = 3, 0  # the new log: offsets 0..2, and the consumer reset to its start
    assert drain(src) == [0, 1, 2]
    assert log.seeks == [0] and src.resets() == [("t.steps", 0)] and src.resets() == []
