"""Every state change of every detection reaches the store once, across a worker takeover.

Two stragglers on one host, each opened, updated and resolved; between them
the partition moves to a new worker (a fresh ledger owner), which finds the
second straggler again under its own id and re-emits the old worker's last
two messages (as a worker that takes over uncommitted input does). Everything
goes through a real broker and the sink into chdb, and is read back with
``stepwatch query job_timeline``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import threading
import time

import pytest

from stepwatch.cli import main
from stepwatch.contract import DetectionMessage
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.kafka import ensure_topics
from stepwatch.streams.worker.ledger import Ledger
from tests.support import store_testdata as D

pytestmark = pytest.mark.integration
T0 = D.T0


def det(id_: str, rank: int, state: str, step: int, first: int) -> DetectionMessage:
    """A change as the core emits it: ``first`` is the step the detection opened at."""
    return DetectionMessage(
        host="gpu-01",
        ts=T0 + step,
        id=id_,
        job_id="jobX",
        type="straggler",
        state=state,
        rank=rank,
        step=step,
        first_step=first,
        opened_at=T0 + first,
        cause="gpu",
        summary=f"rank {rank} {state}",
    )


def worker_output() -> tuple[list[DetectionMessage], int]:
    """What two workers publish, re-emission included; and the distinct changes."""
    ledger = Ledger()
    old = ledger.for_partition(0)
    out = [
        old.record(det("a", 1, "open", 10, 10)),
        old.record(det("b", 2, "open", 12, 12)),
        old.record(det("a", 1, "update", 20, 10)),
        old.record(det("b", 2, "update", 22, 12)),
        old.record(det("a", 1, "resolved", 30, 10)),
    ]
    new = ledger.for_partition(0)  # the takeover: a new owner of the partition
    out += [
        out[-2],
        out[-1],  # re-emitted by the worker that took over
        new.record(det("b-new", 2, "open", 40, 40)),
        new.record(det("b-new", 2, "resolved", 50, 40)),
    ]
    return out, 7


def handled(sink: Sink) -> float:
    m = sink.metrics
    return m.value("stepwatch_sink_rows_inserted_total", table="detections") + m.value(
        "stepwatch_sink_duplicate_messages_total"
    )


@pytest.mark.timeout(120)
def test_every_detection_change_is_stored_once_and_shown_in_the_timeline(broker, tmp_path):
    from stepwatch.settings import Settings

    published, distinct = worker_output()
    settings = Settings.load(
        env={},
        bootstrap_servers=broker.bootstrap,
        topic_prefix="d",
        partitions=2,
        store_path=str(tmp_path / "chdb"),
    )
    ensure_topics(settings, sink_topics("d"))
    D.produce(broker.bootstrap, "d", published)  # type: ignore[arg-type]
    store = ChdbStore(settings.store_path)
    Migrator(store, raw_ttl_days=20000).migrate()
    sink = Sink(
        store,
        KafkaSource(settings, "it-detections"),
        sink_topics("d"),
        SinkConfig(batch_messages=100, batch_seconds=0.2),
    )
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and handled(sink) < len(published):
            time.sleep(0.2)
    finally:
        sink.stop()
        thread.join(15)
    rows = store.query(
        "SELECT id, state, seq, toFloat64(opened_at) FROM detections FINAL ORDER BY id, seq"
    ).rows
    store.close()
    assert [tuple(r[:3]) for r in rows] == [
        ("a", "open", 0),
        ("a", "update", 1),
        ("a", "resolved", 2),
        ("b", "open", 0),
        ("b", "update", 1),
        ("b", "update", 2),
        ("b", "resolved", 3),
    ]
    assert len(rows) == distinct
    assert {r[3] for r in rows if r[0] == "b"} == {
        T0 + 12
    }  # the original opening, after the takeover
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            main(
                [
                    "query",
                    "job_timeline",
                    "--job",
                    "jobX",
                    "--format",
                    "csv",
                    "--store-path",
                    settings.store_path,
                ]
            )
            == 0
        )
    timeline = [r["what"] for r in csv.DictReader(io.StringIO(buf.getvalue()))]
    assert timeline == [
        "straggler:open",
        "straggler:open",
        "straggler:update",
        "straggler:update",
        "straggler:resolved",
        "straggler:update",
        "straggler:resolved",
    ]
