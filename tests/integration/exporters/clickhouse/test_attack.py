"""Attacks on the sink and the store: each through the real sink, broker and embedded engine.

The sink consumes a real broker into a chdb store it owns; afterwards the test
reads what the store really holds. The attacks (docs/security.md, "Boundary 2"
and "The store"):

* a sender reusing an agent's (host, inst, seq) with other content, first (the
  first content accepted stays; the agent's messages are dead letters, kept);
* a message 200 days old (the raw tables' TTL would drop it silently);
* a detection forged by a producer outside the allow-list;
* the store's files read by another local user (nobody);
* more concurrent queries than the endpoint runs at once.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import stat
import tempfile
import threading
import time

import pytest

from stepwatch.contract import (
    DetectionMessage,
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Message,
    StepMessage,
    StepRecord,
    Topics,
    encode,
)
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.service import QueryService
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.kafka import ensure_topics
from tests.integration.exporters.clickhouse.test_security import call

pytestmark = pytest.mark.integration

NOBODY = 65534


def step(job: str, host: str, inst: str, seq: int, ts: float) -> StepMessage:
    return StepMessage(
        host=host,
        ts=ts,
        inst=inst,
        seq=seq,
        job_id=job,
        steps=[
            StepRecord(job_id=job, rank=r, world_size=2, step=seq, start=ts - 1, end=ts - 0.1)
            for r in range(2)
        ],
    )


def detection(id_: str, producer: str, ts: float) -> tuple[str, bytes, bytes]:
    """A detection as raw bytes on the detections topic, naming its producer."""
    body = json.loads(
        encode(
            DetectionMessage(
                host="sa0",
                ts=ts,
                inst=id_,
                seq=0,
                id=id_,
                job_id="real-job",
                type="straggler",
                rank=1,
            )
        )
    )
    return (
        Topics("ast").detections,
        b"real-job",
        json.dumps({**body, "producer": producer}).encode(),
    )


def traffic(now: float) -> list[Message | tuple[str, bytes, bytes]]:
    # one partition, forger first: the order the sink reads them in is the order sent
    forged = [
        (Topics("ast").steps, b"sa0", encode(step("forged-job", "sa0", "agent-1", s, now - 30 + s)))
        for s in range(3)
    ]
    real = [
        (Topics("ast").steps, b"sa0", encode(step("real-job", "sa0", "agent-1", s, now - 30 + s)))
        for s in range(10)
    ]
    old = GpuMessage(
        host="old0",
        ts=now - 200 * 86400,
        inst="o",
        seq=0,
        gpus=[GpuReading(index=0, power_w=100.0)],
    )
    # an agent of another make stamping its events with a clock since boot: the raw
    # tables' age limit leaves events alone, so it was stored under 1970-01-02
    boot = EventMessage(host="boot0", ts=86400.0, inst="b", seq=0, type=EventType.RESTART)
    return [
        *forged,
        *real,
        old,
        boot,
        detection("d-real", "worker-a", now),
        detection("d-forged", "evil", now),
    ]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The traffic through a real broker and sink into a chdb store; the sink's metrics."""
    from stepwatch.daemons.broker import DevBroker
    from stepwatch.settings import Settings

    work = tmp_path_factory.mktemp("attack-store")
    # pytest's own tree is private to root: the store goes where nobody can reach its door
    shared = tempfile.mkdtemp(prefix="stepwatch-attack-")
    os.chmod(shared, 0o755)
    with DevBroker(log_path=str(work / "broker.log")) as broker:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            topic_prefix="ast",
            partitions=2,
            store_path=os.path.join(shared, "chdb"),
            store_detection_producers="worker-a,worker-b",
            kafka_config={"session.timeout.ms": "6000"},
        )
        ensure_topics(settings, sink_topics("ast"))
        messages = traffic(time.time())
        from tests.support.stream_support import publish

        publish(settings, messages)
        store = ChdbStore(settings.store_path)
        Migrator(store, raw_ttl_days=settings.store_raw_ttl_days).migrate()
        config = SinkConfig.from_settings(settings)
        config = SinkConfig(**{**config.__dict__, "batch_seconds": 0.3, "group_id": "it-attack"})
        sink = Sink(store, KafkaSource(settings, "it-attack"), sink_topics("ast"), config)
        thread = threading.Thread(target=sink.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(
                sink.metrics.value("stepwatch_sink_messages_total", topic=t)
                for t in sink_topics("ast")
            ) < len(messages):
                time.sleep(0.3)
            time.sleep(1.0)  # the last batch written
        finally:
            sink.stop()
            thread.join(15)
        yield store, sink, settings
    store.close()
    shutil.rmtree(shared, ignore_errors=True)


def rows(store: ChdbStore, sql: str) -> list[tuple]:
    return [tuple(r) for r in store.query(sql).rows]


def test_a_forger_reusing_an_agents_sequence_numbers_first_cannot_make_its_data_vanish(stored):
    store, sink, _ = stored
    stored_rows = rows(
        store,
        "SELECT job_id, step, count() FROM step_events FINAL "
        "GROUP BY job_id, step ORDER BY job_id, step",
    )
    # the first content accepted for a number stays (a replay can never replace it) ...
    assert stored_rows == [
        *[("forged-job", s, 2) for s in range(3)],
        *[("real-job", s, 2) for s in range(3, 10)],
    ]
    # ... and the agent's messages it shadowed are flagged for a human, payload and all
    conflicts = rows(
        store,
        "SELECT seq, JSONExtractString(payload, 'job_id') FROM dead_letters "
        "WHERE reason = 'seq_conflict' ORDER BY seq",
    )
    assert conflicts == [(0, "real-job"), (1, "real-job"), (2, "real-job")]
    assert sink.metrics.value("stepwatch_sink_dead_letter_rows_total", reason="seq_conflict") == 3


def test_a_message_200_days_old_is_a_dead_letter_not_a_silent_loss(stored):
    store, sink, _ = stored
    assert rows(store, "SELECT reason FROM dead_letters WHERE host = 'old0'") == [("too_old",)]
    assert sink.metrics.value("stepwatch_sink_dead_letter_rows_total", reason="too_old") == 1


def test_a_timestamp_from_a_clock_since_boot_is_a_dead_letter_not_1970(stored):
    store, _, _ = stored
    assert rows(store, "SELECT count() FROM events WHERE host = 'boot0'") == [(0,)]
    ((reason, detail),) = rows(
        store, "SELECT reason, detail FROM dead_letters WHERE host = 'boot0'"
    )
    assert reason == "absurd_value" and "$.ts" in detail


def test_a_forged_detection_is_not_stored_as_genuine(stored):
    store, _, _ = stored
    assert rows(store, "SELECT id, producer FROM detections") == [("d-real", "worker-a")]
    assert rows(store, "SELECT reason, inst FROM dead_letters WHERE kind = 'detection'") == [
        ("unknown_producer", "d-forged")
    ]


def test_the_store_is_its_owners_alone(stored):
    _, _, settings = stored
    path = settings.store_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    entries = [
        os.path.join(root, n) for root, dirs, files in os.walk(path) for n in (*dirs, *files)
    ]
    loose = [e for e in entries if not os.path.islink(e) and os.lstat(e).st_mode & 0o077]
    assert len(entries) > 50
    assert loose == []
    data = next(
        os.path.join(root, f)
        for root, _, files in os.walk(path)
        for f in files
        if f.endswith(".bin")
    )
    assert read_as_nobody(data) == "PermissionError"


def test_an_existing_loose_store_is_tightened_on_open(stored):
    store, _, settings = stored
    path = settings.store_path
    store.close()
    for root, _dirs, files in os.walk(path):  # modes as main left them: 0755 and 0644
        os.chmod(root, 0o755)
        for f in files:
            if not os.path.islink(os.path.join(root, f)):
                os.chmod(os.path.join(root, f), 0o644)
    data = next(
        os.path.join(root, f)
        for root, _, files in os.walk(path)
        for f in files
        if f.endswith(".bin")
    )
    assert read_as_nobody(data) == "read"  # the attack works on a loose store
    reopened = ChdbStore(path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(data).st_mode) == 0o600
        assert read_as_nobody(data) == "PermissionError"
        assert (
            reopened.query("SELECT count() FROM step_events WHERE job_id = 'real-job'").scalar()
            == 14
        )
    finally:
        reopened.close()


def read_as_nobody(path: str) -> str:
    """Fork; the child becomes nobody and opens ``path``: what happened, as a word."""
    if os.geteuid() != 0:
        pytest.skip("becoming nobody needs root")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        word = b"read"
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with open(path, "rb") as f:
                f.read(1)
        except PermissionError:
            word = b"PermissionError"
        except BaseException as err:
            word = type(err).__name__.encode()
        os.write(w, word)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_the_endpoint_runs_at_most_its_limit_of_queries_at_once(tmp_path):
    store = ChdbStore(str(tmp_path / "c"))
    store.close()
    slow = "SELECT sum(sleepEachRow(0.5)) FROM numbers(3) SETTINGS max_block_size = 1"
    with QueryService(
        str(tmp_path / "c"),
        max_concurrent_queries=2,
        queue_seconds=0.2,
        max_memory_usage=1 << 30,
        max_total_memory=1 << 30,
    ) as service:
        status, out = call(service, "SELECT getSetting('max_memory_usage')")
        assert (status, out.strip()) == (200, str(512 << 20).encode())  # total / concurrency
        status, out = call(service, "SELECT getSetting('max_memory_usage_for_user')")
        assert (status, out.strip()) == (200, str(1 << 30).encode())  # the engine's bound on all
        status, out = call(service, "SELECT 1", max_memory_usage_for_user=str(4 << 30))
        assert status == 200  # a client may ask for more: it gets the cap
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(lambda _: call(service, slow), range(3)))
        statuses = sorted(s for s, _ in replies)
        assert statuses == [200, 200, 503], replies
        busy = next(out for s, out in replies if s == 503)
        assert b"TOO_MANY_SIMULTANEOUS_QUERIES" in busy and b"Maximum: 2" in busy
        assert call(service, "SELECT 1")[0] == 200  # slots are given back
