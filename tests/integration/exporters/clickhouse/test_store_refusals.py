"""An insert the engine refuses after parsing its data is an error, never a success.

Before: the embedded store inserted through chdb's streaming ``send_insert``, whose
``finish()`` raised only on parse errors. An error raised while the block was
written (more than 100 partitions in one block, a CHECK constraint, a full disk)
was dropped and the insert reported whole: 120 contract-valid events, one a month
from 1990, left 0 rows in ``events``, no dead letter, offsets committed and the
senders' sequence numbers noted (so even a replay dropped them as duplicates).
The endpoint's ``INSERT`` still streams (a second statement after a Values row
would run otherwise). Driven with the
real engine and the real sink loop (the broker's log is a list here: what is
tested is what the store holds).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from stepwatch.contract import (
    EventMessage,
    GpuMessage,
    GpuReading,
    StepMessage,
    StepRecord,
    Topics,
    encode,
)
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.prepare import Record
from stepwatch.exporters.clickhouse.service import QueryService
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.exporters.clickhouse.store import ClickHouseError
from tests.integration.exporters.clickhouse.test_security import EVENT_COLS, call

pytestmark = pytest.mark.integration
MONTH = 31 * 86400
Y2002 = 1009843200.0  # 2002-01-01: the contract refuses times before 2001-09-09


class ListSource:
    """The broker's log as a list: one partition a topic, commits recorded."""

    def __init__(self) -> None:
        self.queue: list[Record] = []
        self.commits: dict[tuple[str, int], int] = {}

    def subscribe(self, topics: Any, on_assign: Any, on_revoke: Any) -> None:
        on_assign([(t, 0) for t in topics])

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        out, self.queue = self.queue[:max_records], self.queue[max_records:]
        return out

    def committed(self, tps: Any) -> dict[tuple[str, int], int | None]:
        return {tp: self.commits.get(tp) for tp in tps}

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        self.commits.update(offsets)

    def log_end(self, tps: Any) -> dict[tuple[str, int], int]:
        return {}  # not known: every plan stands

    def resets(self) -> list[tuple[str, int]]:
        return []

    def lag(self, committed: Any) -> dict[tuple[str, int], int]:
        return {}

    def close(self) -> None:
        pass


@pytest.fixture()
def store(tmp_path):
    s = ChdbStore(str(tmp_path / "store"))
    Migrator(s, raw_ttl_days=20000).migrate()
    yield s
    s.close()


def monthly(n: int) -> list[tuple[Any, ...]]:
    return [(Y2002 + i * MONTH, "", "h", "xid", "old", {}, "i", i) for i in range(n)]


def test_an_insert_the_engine_refuses_while_writing_raises(store) -> None:
    with pytest.raises(ClickHouseError) as err:
        store.insert("events", EVENT_COLS, monthly(101))  # 101 partitions in one block
    assert err.value.code == 252 and err.value.data_error
    store.command(
        "CREATE TABLE checked (v UInt32, CONSTRAINT small CHECK v < 10) "
        "ENGINE = MergeTree ORDER BY v"
    )
    with pytest.raises(ClickHouseError) as err:
        store.insert("checked", ("v",), [(1,), (99,)])
    assert err.value.code == 469
    assert store.query("SELECT count() FROM events").scalar() == 0
    assert store.query("SELECT count() FROM checked").scalar() == 0
    assert store.insert("events", EVENT_COLS, monthly(100)) == 100  # the limit itself is fine
    assert store.query("SELECT count() FROM events").scalar() == 100


def test_the_sink_stores_events_of_many_months_and_commits_only_then(store) -> None:
    sink, source = sink_over(store)
    topic = Topics("p").events
    for i in range(120):
        message = EventMessage(host="h", ts=Y2002 + i * MONTH, inst="i", seq=i, detail="old")
        source.queue.append(Record(topic, 0, i, encode(message), b"k"))
    deadline = time.monotonic() + 60
    while source.commits.get((topic, 0)) != 120 and time.monotonic() < deadline:
        sink.step()
    assert source.commits.get((topic, 0)) == 120
    assert store.query("SELECT count(), uniqExact(seq) FROM events").rows == [(120, 120)]
    assert store.query("SELECT count() FROM dead_letters").scalar() == 0


def test_an_insert_through_the_endpoint_that_does_not_parse_is_an_error(store) -> None:
    """The endpoint streams an insert's data to the format's parser (never to the SQL
    parser: test_security.py); a row that does not parse is an error and nothing is kept.
    What the engine refuses after parsing (a CHECK) is not reported there: docs/store.md."""
    with QueryService(store.path, allow_writes=True) as rw:
        call(rw, "CREATE TABLE c (v UInt32) ENGINE = MergeTree ORDER BY v")
        status, out = call(rw, "INSERT INTO c FORMAT CSV", body=b"0\nx\n")
        assert status != 200 and b"(INCORRECT_DATA)" in out, out[:300]
        assert call(rw, "SELECT count() FROM c") == (200, b"0\n")
        status, out = call(rw, "INSERT INTO c FORMAT Values", body=b"(0), (1)")
        assert status == 200, out[:300]
        assert call(rw, "SELECT count() FROM c") == (200, b"2\n")


def sink_over(store: ChdbStore) -> tuple[Sink, ListSource]:
    source = ListSource()
    sink = Sink(store, source, sink_topics("p"), SinkConfig(batch_seconds=0.05))
    source.subscribe(sink.topics, sink._on_assign, sink._on_revoke)
    return sink, source


def test_a_record_repeated_in_one_message_is_counted_once_by_the_rollups(store) -> None:
    """Before: one step message with the same record 500 times left 1 raw row (the
    table folds them) but 500 rank-steps and 500,000 tokens in ``step_rollup_1m``."""
    sink, source = sink_over(store)
    now = time.time()
    record = StepRecord(
        job_id="j", rank=0, world_size=1, step=7, start=now - 2, end=now - 1, tokens=1000
    )
    named = msgspec.structs.replace(record, host="h")  # the message's host, named: same row
    steps = StepMessage(
        host="h", ts=now, inst="a", seq=0, job_id="j", steps=[record] * 499 + [named]
    )
    reading = GpuReading(index=0, util_gpu_pct=50.0)
    gpus = GpuMessage(host="h", ts=now, inst="a", seq=1, job_id="j", gpus=[reading] * 3)
    topics = Topics("p")
    source.queue += [
        Record(topics.steps, 0, 0, encode(steps), b"k"),
        Record(topics.gpu, 0, 0, encode(gpus), b"k"),
    ]
    deadline = time.monotonic() + 60
    while len(source.commits) < 2 and time.monotonic() < deadline:
        sink.step()
    q = store.query
    assert q("SELECT count() FROM step_events").scalar() == 1
    assert q("SELECT sum(rank_steps), sum(tokens) FROM step_rollup_1m").rows == [(1, 1000)]
    assert q("SELECT count() FROM gpu_samples").scalar() == 1
    dead = q("SELECT topic, reason, detail FROM dead_letters ORDER BY topic").rows
    assert [(t, r) for t, r, _ in dead] == [
        (topics.gpu, "duplicate_record"),
        (topics.steps, "duplicate_record"),
    ]
    assert dead[1][2].startswith("499 record(s) repeat an earlier one: steps[1]")
