"""The sink loop against a fake broker log and a fake store: commit after insert,
exact replay after a crash, poison rows isolated, retries."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from stepwatch.contract import Phases, StepMessage, StepRecord, encode
from stepwatch.errors import TransportError
from stepwatch.exporters.clickhouse.prepare import Record
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig
from stepwatch.exporters.clickhouse.sink_metrics import SinkMetrics
from stepwatch.exporters.clickhouse.store import ClickHouseError, Result
from stepwatch.exporters.clickhouse.writer import StopRequested, Writer

NOW = 1767225600.0
TOPICS = ("t.steps",)


class Crash(BaseException):
    """A process death between insert and commit (not an Exception: nothing catches it)."""


class FakeLog:
    """The broker: records per partition and the group's committed offsets."""

    def __init__(self, messages: list[StepMessage], partitions: int = 2) -> None:
        self.records: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for m in messages:
            tp = ("t.steps", m.seq % partitions)
            self.records[tp].append(Record(tp[0], tp[1], len(self.records[tp]), encode(m), b"j"))
        self.committed: dict[tuple[str, int], int] = {}


class FakeSource:
    def __init__(self, log: FakeLog) -> None:
        self.log = log
        self.pos = {tp: log.committed.get(tp, 0) for tp in log.records}

    def subscribe(self, topics, on_assign, on_revoke) -> None:
        on_assign(sorted(self.log.records))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        out: list[Record] = []
        for tp, records in sorted(self.log.records.items()):
            if tp in getattr(self, "reset", []):
                continue  # as KafkaSource: the poll that finds a reset seeks, reads nothing
            take = records[self.pos[tp] : self.pos[tp] + max(1, max_records // 2)]
            self.pos[tp] += len(take)
            out.extend(take)
        return out

    def committed(self, tps):
        return {tp: self.log.committed.get(tp) for tp in tps}

    def commit(self, offsets) -> None:
        self.log.committed.update(offsets)

    def log_end(self, tps):
        return {tp: len(self.log.records[tp]) for tp in tps}

    def resets(self):
        out, self.reset = getattr(self, "reset", []), []
        return out

    def start_again(self, tp, records) -> None:
        """The log of ``tp`` lost its records and holds ``records`` from offset 0."""
        self.log.records[tp] = records
        self.pos[tp] = 0
        self.reset = [tp]

    def lag(self, committed):
        return {}

    def close(self) -> None:
        pass


class FakeStore:
    """Tables as lists; insert tokens deduplicate like ClickHouse's dedup window."""

    backend = "fake"
    database = "t"

    def __init__(self) -> None:
        self.tables: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.tokens: set[tuple[str, str]] = set()
        self.deduplicated = 0
        self.failures: list[ClickHouseError] = []
        self.poison_rank: int | None = None

    def command(self, sql, params=None) -> None:
        pass

    def insert(self, table, columns, rows, token=None) -> int:
        if self.failures:
            raise self.failures.pop(0)
        data = [dict(zip(columns, r, strict=True)) for r in rows]
        if table == "step_events" and any(d["rank"] == self.poison_rank for d in data):
            raise ClickHouseError("Code: 27. DB::Exception: Cannot parse input", 27)
        if token and (table, token) in self.tokens:
            self.deduplicated += 1
            return len(rows)
        if token:
            self.tokens.add((table, token))
        self.tables[table].extend(data)
        return len(rows)

    def query(self, sql, params=None) -> Result:
        if "FROM sink_batches" in sql:
            plans = sorted(
                {
                    (r["first_offset"], r["last_offset"])
                    for r in self.tables["sink_batches"]
                    if (r["consumer_group"], r["topic"], r["partition"])
                    == (params["g"], params["t"], params["p"])
                    and r["last_offset"] >= params["c"]
                }
            )
            return Result(("first_offset", "last_offset"), ("UInt64", "UInt64"), plans)
        return Result((), (), [])

    def close(self) -> None:
        pass


def messages(n: int = 40, ranks: int = 4) -> list[StepMessage]:
    out = []
    for seq in range(n):
        steps = [
            StepRecord(
                job_id="j",
                rank=r,
                world_size=ranks,
                step=seq,
                start=NOW + seq,
                end=NOW + seq + 1,
                phases=Phases(forward=0.5),
            )
            for r in range(ranks)
        ]
        out.append(
            StepMessage(host="h", ts=NOW + seq + 1, inst="i", seq=seq, job_id="j", steps=steps)
        )
    return out


def drain(sink: Sink, polls: int = 50) -> None:
    for _ in range(polls):
        sink.step()
    sink._write(sink.planner.due(force=True))


def config(**kw: Any) -> SinkConfig:
    base = {"batch_messages": 5, "batch_seconds": 0.0, "poll_max": 6, "retry_initial": 0.001}
    return SinkConfig(**{**base, **kw})


def test_offsets_are_committed_after_the_rows_are_written():
    log, store = FakeLog(messages(10)), FakeStore()
    seen: list[tuple[int, dict]] = []
    sink = Sink(
        store,
        FakeSource(log),
        TOPICS,
        config(),
        after_insert=lambda b: seen.append((len(store.tables["step_events"]), dict(log.committed))),
    )
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    drain(sink)
    assert len(store.tables["step_events"]) == 40
    assert log.committed == {("t.steps", 0): 5, ("t.steps", 1): 5}
    # at every hook call the rows of the batch were in, the offsets not yet committed
    assert seen[0][0] > 0 and seen[0][1] == {}
    assert len(store.tables["sink_batches"]) == sink.metrics.value(
        "stepwatch_sink_batches_total", kind="new"
    )


def test_crash_between_insert_and_commit_then_replay_writes_each_row_once():
    log, store = FakeLog(messages(40)), FakeStore()
    calls = 0

    def crash_on_third(batches):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Crash

    first = Sink(
        store, FakeSource(log), TOPICS, config(batch_messages=3), after_insert=crash_on_third
    )
    first.source.subscribe(TOPICS, first._on_assign, first._on_revoke)
    with pytest.raises(Crash):
        drain(first)
    written_before = len(store.tables["step_events"])
    assert written_before > 0 and sum(log.committed.values()) * 4 < written_before
    # The restarted sink batches differently (bigger batches): only the plans make its
    # first batches repeat the crashed ones' bounds, and so their dedup tokens.
    second = Sink(store, FakeSource(log), TOPICS, config(batch_messages=7, poll_max=14))
    second.source.subscribe(TOPICS, second._on_assign, second._on_revoke)
    drain(second)
    rows = store.tables["step_events"]
    keys = {(r["host"], r["inst"], r["seq"], r["rank"]) for r in rows}
    assert len(rows) == len(keys) == 40 * 4
    assert store.deduplicated >= 1
    assert second.metrics.value("stepwatch_sink_batches_total", kind="replayed") >= 1
    assert log.committed == {("t.steps", 0): 20, ("t.steps", 1): 20}


def test_without_plans_a_replay_would_duplicate_rows():
    """The control experiment: the plans are what keeps the replay exact."""
    log, store = FakeLog(messages(40)), FakeStore()
    calls = 0

    def crash_on_third(batches):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Crash

    first = Sink(
        store, FakeSource(log), TOPICS, config(batch_messages=3), after_insert=crash_on_third
    )
    first.source.subscribe(TOPICS, first._on_assign, first._on_revoke)
    with pytest.raises(Crash):
        drain(first)
    store.tables["sink_batches"].clear()
    second = Sink(store, FakeSource(log), TOPICS, config(batch_messages=7, poll_max=14))
    second.source.subscribe(TOPICS, second._on_assign, second._on_revoke)
    drain(second)
    assert len(store.tables["step_events"]) > 40 * 4


def test_a_poison_row_goes_to_the_dead_letters_and_the_rest_is_written():
    log, store = FakeLog(messages(10)), FakeStore()
    store.poison_rank = 2
    sink = Sink(store, FakeSource(log), TOPICS, config(batch_messages=10))
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    drain(sink)
    assert len(store.tables["step_events"]) == 30
    dead = store.tables["dead_letters"]
    assert len(dead) == 10 and {d["reason"] for d in dead} == {"rejected_by_store"}
    assert all("Cannot parse input" in d["detail"] for d in dead)
    assert (
        sink.metrics.value("stepwatch_sink_dead_letter_rows_total", reason="rejected_by_store")
        == 10
    )
    assert sum(log.committed.values()) == 10


def test_store_errors_are_retried_with_the_same_token():
    log, store = FakeLog(messages(4), partitions=1), FakeStore()
    store.failures = [ClickHouseError("Code: 210. DB::Exception: Connection refused", 210)] * 2
    sink = Sink(store, FakeSource(log), TOPICS, config(batch_messages=10))
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    drain(sink, polls=2)
    assert len(store.tables["step_events"]) == 16
    assert sink.metrics.value("stepwatch_sink_insert_retries_total", table="sink_batches") == 2


def test_stop_during_retries_raises_without_writing():
    store = FakeStore()
    store.failures = [ClickHouseError("Code: 210. DB::Exception: down", 210)] * 100
    writer = Writer(
        store, SinkMetrics(), retry_initial=0.01, should_stop=lambda: True, sleep=lambda s: None
    )
    with pytest.raises(StopRequested):
        writer.insert("step_events", ("a",), [(1,)], token="x")


def test_run_flushes_commits_and_closes_on_stop():
    log, store = FakeLog(messages(6)), FakeStore()
    sink = Sink(store, FakeSource(log), TOPICS, config(batch_messages=1000, batch_seconds=3600))
    closed = []
    sink.source.close = lambda: closed.append(True)  # type: ignore[method-assign]
    polls = 0
    original = sink.source.poll

    def poll(n, t):
        nonlocal polls
        polls += 1
        if polls == 3:
            sink.stop()
        return original(n, t)

    sink.source.poll = poll  # type: ignore[method-assign]
    sink.run()
    assert len(store.tables["step_events"]) == 24 and closed == [True]
    assert sum(log.committed.values()) == 6
    assert sink.metrics.value("stepwatch_sink_ready") == 0


def test_plans_are_read_again_when_the_store_is_briefly_down():
    log, store = FakeLog(messages(4), partitions=1), FakeStore()
    calls = 0
    original = store.query

    def flaky(sql, params=None):
        nonlocal calls
        if "FROM sink_batches" in sql:
            calls += 1
            if calls <= 2:
                raise ClickHouseError("Code: 210. DB::Exception: Connection refused", 210)
        return original(sql, params)

    store.query = flaky  # type: ignore[method-assign]
    sink = Sink(store, FakeSource(log), TOPICS, config(batch_messages=10))
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    drain(sink, polls=2)
    assert calls == 3 and len(store.tables["step_events"]) == 16
    assert sink.metrics.value("stepwatch_sink_insert_retries_total", table="sink_batches") == 2


def test_a_record_that_breaks_the_mapping_is_kept_as_a_dead_letter(monkeypatch):
    from stepwatch.exporters.clickhouse import rows as R

    log, store = FakeLog(messages(3), partitions=1), FakeStore()
    original = R.step_row

    def fragile(msg, rec):
        if msg.seq == 1 and rec.rank == 2:  # after two rows of the message were mapped
            raise KeyError("surprise")
        return original(msg, rec)

    monkeypatch.setattr(R, "step_row", fragile)
    sink = Sink(store, FakeSource(log), TOPICS, config(batch_messages=10))
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    drain(sink, polls=2)
    assert len(store.tables["step_events"]) == 8
    assert [(d["reason"], d["seq"]) for d in store.tables["dead_letters"]] == [
        ("internal_error", 1)
    ]


def test_offsets_reused_by_new_records_are_stored_not_dropped_as_duplicates():
    """A broker that lost its log (memory-only dev broker; a re-created topic) hands out
    the same offsets again: the old plans replay over new records, and their content
    makes new insert tokens, so the new rows are stored - while an exact replay of the
    same records is still dropped (exactly once)."""
    store = FakeStore()
    old = FakeLog(messages(20))
    first = Sink(store, FakeSource(old), TOPICS, config(batch_messages=3))
    first.source.subscribe(TOPICS, first._on_assign, first._on_revoke)
    drain(first)
    assert len(store.tables["step_events"]) == 20 * 4
    # the broker restarts empty: committed offsets are gone, the same offsets hold new records
    fresh = [
        StepMessage(host="h2", ts=m.ts + 1000, inst="i2", seq=m.seq, job_id="j2", steps=m.steps)
        for m in messages(20)
    ]
    new = FakeLog(fresh)
    second = Sink(store, FakeSource(new), TOPICS, config(batch_messages=3))
    second.source.subscribe(TOPICS, second._on_assign, second._on_revoke)
    drain(second)
    assert second.metrics.value("stepwatch_sink_batches_total", kind="replayed") >= 1
    rows = store.tables["step_events"]
    assert sum(r["host"] == "h2" for r in rows) == 20 * 4  # every new row stored
    assert sum(r["host"] == "h" for r in rows) == 20 * 4  # the old ones exactly once


def test_plans_beyond_a_shorter_new_log_do_not_hold_its_records_back():
    """The broker lost its log and its committed offsets (a re-created topic; the memory-only
    development broker restarted), and the new log is *shorter* than the old plans. Before,
    the plans of the old log were cut again and the planner waited for their last offsets,
    which never came: none of the new records was stored (real broker and CLI sink: 200
    messages after a restart, none in the store)."""
    store = FakeStore()
    first = Sink(
        store, FakeSource(FakeLog(messages(20))), TOPICS, config(poll_max=40, batch_messages=8)
    )
    first.source.subscribe(TOPICS, first._on_assign, first._on_revoke)
    drain(first)  # plans (0, 7) and (8, 9) per partition
    fresh = [
        StepMessage(host="h2", ts=m.ts + 1000, inst="i2", seq=m.seq, job_id="j2", steps=m.steps)
        for m in messages(6)
    ]
    second = Sink(store, FakeSource(FakeLog(fresh)), TOPICS, config(batch_messages=8))
    second.source.subscribe(TOPICS, second._on_assign, second._on_revoke)
    for _ in range(20):
        second.step()  # not forced: a running sink with new records waiting
    rows = store.tables["step_events"]
    assert sum(r["host"] == "h2" for r in rows) == 6 * 4
    assert second.source.log.committed == {tp: 3 for tp in second.source.log.records}


def test_a_log_that_starts_again_under_a_running_sink_is_stored():
    """A re-created topic: librdkafka reads the new log from offset 0 with no rebalance.
    Before, the planner dropped every offset below what it had read of the old log as a
    re-delivery: the new records were never stored, and later commits passed them."""
    store = FakeStore()
    log = FakeLog(messages(20))
    sink = Sink(store, FakeSource(log), TOPICS, config())
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    drain(sink)
    tp = ("t.steps", 0)
    fresh = [
        Record(
            tp[0],
            tp[1],
            i,
            encode(
                StepMessage(host="h2", ts=NOW + i, inst="i2", seq=i, job_id="j2", steps=m.steps)
            ),
            b"j",
        )
        for i, m in enumerate(messages(4))
    ]
    sink.source.start_again(tp, fresh)
    drain(sink)
    rows = store.tables["step_events"]
    assert sum(r["host"] == "h2" for r in rows) == 4 * 4
    assert sum(r["host"] == "h" for r in rows) == 20 * 4
    assert log.committed[tp] == 4


def test_plans_are_kept_when_the_log_end_is_unknown():
    """A broker that does not say where its log ends: the plans stand (exact replays first)."""
    store = FakeStore()
    sink = Sink(store, FakeSource(FakeLog(messages(4))), TOPICS, config())
    sink.source.log_end = _no_log_end  # type: ignore[method-assign]
    store.tables["sink_batches"].append(
        {
            "consumer_group": "stepwatch-store",
            "topic": "t.steps",
            "partition": 0,
            "first_offset": 0,
            "last_offset": 9,
        }
    )
    sink._on_assign([("t.steps", 0)])
    sink.step()  # offsets 0..2 read: the plan waits for 9
    assert sink.planner.waiting() == [("t.steps", 0)]
    assert sink.planner.pending_plans(("t.steps", 0)) == [(0, 9)]


def _no_log_end(tps):
    raise TransportError("no watermarks")


def test_freed_memory_is_released_once_per_interval():
    log, store = FakeLog(messages(10)), FakeStore()
    now = [0.0]
    released: list[float] = []
    sink = Sink(
        store,
        FakeSource(log),
        TOPICS,
        config(release_seconds=60.0),
        release=lambda: released.append(now[0]),
        clock=lambda: now[0],
    )
    sink.source.subscribe(TOPICS, sink._on_assign, sink._on_revoke)
    for t in (0.0, 30.0, 59.9, 60.0, 61.0, 119.0, 120.5):
        now[0] = t
        sink.step()
    assert released == [60.0, 120.5]
