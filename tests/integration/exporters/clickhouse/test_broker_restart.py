"""The broker loses its log under a running sink: the new records are stored.

The development broker keeps its log in memory, so a restart loses every
record and every committed offset; on a real cluster a re-created topic or an
unclean leader election does the same. The partition's offsets start again at
0 while the store still holds the batch plans of the old log. Before, the sink
cut the new records at the old plans' offsets and waited for their last
offsets, which the new, shorter log did not have: none of the new records was
stored (the CLI sink against the real broker: 200 messages after a restart, 0
in the store, for as long as it ran).

Each log also holds one bad record at the same offset: both are dead letters.
Before, the dead letters' key was (topic, partition, offset, reason), and the
new log's bad record replaced the old one's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from stepwatch.contract import Phases, StepMessage, StepRecord
from stepwatch.daemons.broker import DevBroker
from stepwatch.daemons.process import free_port
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings
from tests.support.stream_support import publish, wait_for

pytestmark = pytest.mark.integration

PREFIX = "br"
OLD = 120  # messages in the log before the restart: plans of 50 records
NEW = 10  # after it: fewer than one old plan
BAD_AT = 3  # the offset of each log's bad record


def with_bad(
    messages: list[StepMessage], value: bytes
) -> list[StepMessage | tuple[str, bytes | None, bytes]]:
    """The messages with a malformed record at offset :data:`BAD_AT` of the one partition."""
    out: list[StepMessage | tuple[str, bytes | None, bytes]] = list(messages)
    out.insert(BAD_AT, (f"{PREFIX}.steps", b"job", value))
    return out


def steps(inst: str, n: int) -> list[StepMessage]:
    now = time.time() - 60
    return [
        StepMessage(
            host="h1",
            ts=now + i * 0.1,
            inst=inst,
            seq=i,
            job_id="job",
            steps=[
                StepRecord(
                    job_id="job",
                    rank=0,
                    world_size=1,
                    step=i,
                    start=now + i * 0.1 - 0.05,
                    end=now + i * 0.1,
                    phases=Phases(forward=0.01),
                )
            ],
        )
        for i in range(n)
    ]


@pytest.fixture()
def restartable(tmp_path) -> Iterator[tuple[list[DevBroker], Settings]]:
    """A broker on a fixed port, so that a new one takes its place; and its settings."""
    port = free_port()
    brokers = [DevBroker(port=port, log_path=str(tmp_path / "broker.log")).start()]
    settings = Settings.load(
        env={
            "STEPWATCH_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "STEPWATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
        },
        bootstrap_servers=brokers[0].bootstrap,
        topic_prefix=PREFIX,
        partitions=1,
        store_path=str(tmp_path / "chdb"),
        sink_metrics_port=0,
    )
    try:
        yield brokers, settings
    finally:
        brokers[-1].stop()


@pytest.mark.timeout(180)
def test_records_after_the_broker_lost_its_log_are_stored(restartable) -> None:
    brokers, settings = restartable
    ensure_topics(settings, sink_topics(PREFIX))
    store = ChdbStore(settings.store_path)
    Migrator(store, raw_ttl_days=settings.store_raw_ttl_days).migrate()
    config = SinkConfig(group_id="br", batch_messages=50, batch_seconds=0.2)
    sink = Sink(store, KafkaSource(settings, "br"), sink_topics(PREFIX), config)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        publish(settings, with_bad(steps("old", OLD), b'{"old": '))
        wait_for(f"{OLD} rows of the old log", lambda: rows(store) == {"old": OLD}, 60)

        brokers[0].stop()  # its log and the group's offsets are gone
        brokers.append(DevBroker(port=brokers[0].port, log_path=brokers[0].log_path).start())
        ensure_topics(settings, sink_topics(PREFIX))
        publish(settings, with_bad(steps("new", NEW), b'{"new": '))
        wait_for(f"{NEW} rows of the new log", lambda: rows(store).get("new") == NEW, 90)
    finally:
        sink.stop()
        thread.join(30)
    assert rows(store) == {"old": OLD, "new": NEW}  # each once
    dead = store.query("SELECT offset, reason, payload FROM dead_letters FINAL ORDER BY payload")
    assert dead.rows == [
        (BAD_AT, "malformed_json", '{"new": '),
        (BAD_AT, "malformed_json", '{"old": '),
    ]
    store.close()


def rows(store: ChdbStore) -> dict[str, int]:
    result = store.query("SELECT inst, count() FROM step_events GROUP BY inst")
    return {str(inst): int(n) for inst, n in result.rows}
