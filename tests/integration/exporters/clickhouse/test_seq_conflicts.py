"""A replayed sender number with other content, as an attacker sends it, through the real sink.

The real message is stored first; then a forged one with the same (host,
inst, kind, seq) and other content (a step of 500 s instead of 0.9 s): in the
same sink run, after a clean sink restart, and after the sink was SIGKILLed
(the real message committed, a later batch inserted but not committed); after
a restart the sink has nothing in memory, only the store can tell. The test reads
what the store really holds: the raw rows without and with ``FINAL`` (what
saved queries read) and the rollups (filled at insert). Also: an existing
store migrates to ``sender_seqs``, and many long NIC device names in a batch
do not cost the ports their counter seed after a restart (the seed lookup).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stepwatch.contract import (
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
    encode,
)
from stepwatch.daemons.broker import DevBroker
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
from stepwatch.exporters.clickhouse.migrations import Migrator, load_migrations
from stepwatch.exporters.clickhouse.prepare import Preparer, Record
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings
from tests.support import paths
from tests.support.stream_support import publish

pytestmark = pytest.mark.integration

JOB = "kjob"
REAL_S = 0.9
FORGED_S = 500.0
REAL = 6  # messages of 2 rank-steps each; the forger replays the last one

# The real sink: its first round of inserts (the real messages) is committed and
# flagged in a file; it is killed (no flush, no commit) right after its second round.
CRASHING_SINK = """
import os, signal, sys
from stepwatch.exporters.clickhouse.runner import run_sink
from stepwatch.exporters.clickhouse.sink import SinkConfig
from stepwatch.settings import Settings
rounds = 0
def crash(batches):
    global rounds
    rounds += 1
    if rounds == 1:
        open(sys.argv[2], "w").close()  # inserted; the commit follows this hook
    else:
        os.kill(os.getpid(), signal.SIGKILL)
run_sink(Settings.load(), SinkConfig(group_id=sys.argv[1], batch_messages=1000,
         batch_seconds=0.5), after_insert=crash, serve=False)
"""


def step(
    seq: int,
    duration: float = REAL_S,
    t0: float | None = None,
    *,
    host: str = "h0",
    inst: str = "agent-1",
    job: str = JOB,
) -> StepMessage:
    base = (t0 if t0 is not None else time.time() - 600) + seq
    return StepMessage(
        host=host,
        ts=base + 1,
        inst=inst,
        seq=seq,
        job_id=job,
        steps=[
            StepRecord(job_id=job, rank=r, world_size=2, step=seq, start=base, end=base + duration)
            for r in range(2)
        ],
    )


@pytest.fixture()
def env(broker: DevBroker, tmp_path) -> Iterator[tuple[Settings, dict[str, str]]]:
    variables = {
        "STEPWATCH_BOOTSTRAP_SERVERS": broker.bootstrap,
        "STEPWATCH_TOPIC_PREFIX": "sc",
        "STEPWATCH_PARTITIONS": "1",
        "STEPWATCH_STORE_PATH": str(tmp_path / "chdb"),
        "STEPWATCH_SINK_METRICS_PORT": "0",
        "STEPWATCH_KAFKA__SESSION_TIMEOUT_MS": "6000",
        "STEPWATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
    }
    settings = Settings.load(env=variables)
    ensure_topics(settings, sink_topics("sc"))
    yield settings, {**os.environ, **variables}


def sink_run(store: ChdbStore, settings: Settings, want: int, group: str = "sc") -> Sink:
    """A fresh sink (nothing in memory) until it has read ``want`` records; then a clean stop."""
    config = SinkConfig(
        **{**SinkConfig.from_settings(settings).__dict__, "batch_seconds": 0.2, "group_id": group}
    )
    sink = Sink(store, KafkaSource(settings, group), sink_topics("sc"), config)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and read(sink) < want:
            time.sleep(0.2)
        assert read(sink) >= want, f"the sink read {read(sink)} of {want} records"
        time.sleep(0.8)  # the last batch written
    finally:
        sink.stop()
        thread.join(20)
    return sink


def read(sink: Sink) -> float:
    return sum(sink.metrics.value("stepwatch_sink_messages_total", topic=t) for t in sink.topics)


def migrated(settings: Settings) -> ChdbStore:
    store = ChdbStore(settings.store_path)
    Migrator(store, raw_ttl_days=settings.store_raw_ttl_days).migrate()
    return store


def holds(store: ChdbStore) -> dict[str, Any]:
    """What the store holds for the job: raw, FINAL, rollups, the forged step, dead letters."""

    def q(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in store.query(sql).rows]

    last = REAL - 1
    return {
        "raw": q(f"SELECT count() FROM step_events WHERE job_id = '{JOB}'")[0][0],
        "final": q(f"SELECT count() FROM step_events FINAL WHERE job_id = '{JOB}'")[0][0],
        "last_final": q(
            f"SELECT rank, round(duration_s, 1) FROM step_events FINAL "
            f"WHERE job_id = '{JOB}' AND step = {last} ORDER BY rank"
        ),
        "rollup": q(
            f"SELECT sum(rank_steps), round(sum(rank_seconds), 1) FROM step_rollup_1m "
            f"WHERE job_id = '{JOB}'"
        )[0],
        "placement": q(f"SELECT sum(rank_steps) FROM rank_placement WHERE job_id = '{JOB}'")[0][0],
        "dead": q("SELECT reason, seq FROM dead_letters ORDER BY offset"),
    }


def expect_real_only(held: dict[str, Any]) -> None:
    rows = 2 * REAL
    assert held["last_final"] == [(0, REAL_S), (1, REAL_S)]  # FINAL reads the real row
    assert held["raw"] == held["final"] == rows  # the forged rows were never inserted
    assert held["rollup"] == (rows, round(rows * REAL_S, 1))  # nor counted by the rollups
    assert held["placement"] == rows
    assert held["dead"] == [("seq_conflict", REAL - 1)]  # flagged, with its payload


@pytest.mark.timeout(120)
def test_a_replay_with_other_content_in_the_same_run_is_not_stored(env):
    settings, _ = env
    t0 = time.time() - 600
    publish(settings, [*(step(s, t0=t0) for s in range(REAL)), step(REAL - 1, FORGED_S, t0)])
    store = migrated(settings)
    try:
        sink = sink_run(store, settings, REAL + 1)
        expect_real_only(holds(store))
        assert sink.metrics.value("stepwatch_sink_dead_letter_rows_total", reason="seq_conflict")
        forged = json.loads(store.query("SELECT payload FROM dead_letters").scalar())
        first = forged["steps"][0]
        assert round(first["end"] - first["start"]) == FORGED_S  # the forgery, kept for a human
    finally:
        store.close()


@pytest.mark.timeout(150)
def test_a_replay_with_other_content_after_a_sink_restart_is_not_stored(env):
    settings, _ = env
    t0 = time.time() - 600
    publish(settings, [step(s, t0=t0) for s in range(REAL)])
    store = migrated(settings)
    try:
        sink_run(store, settings, REAL)
        publish(settings, [step(REAL - 1, FORGED_S, t0)])
        restarted = sink_run(store, settings, 1)  # same group: reads only the forgery
        expect_real_only(holds(store))
        assert (
            restarted.metrics.value("stepwatch_sink_dead_letter_rows_total", reason="seq_conflict")
            == 1
        )
        # and the real message replayed once more is a duplicate, not a conflict
        publish(settings, [step(REAL - 1, REAL_S, t0)])
        again = sink_run(store, settings, 1)
        expect_real_only(holds(store))
        assert again.metrics.value("stepwatch_sink_duplicate_messages_total") == 1
    finally:
        store.close()


@pytest.mark.timeout(180)
def test_a_replay_with_other_content_after_a_sigkill_is_not_stored(env, tmp_path):
    settings, variables = env
    t0 = time.time() - 600
    publish(settings, [step(s, t0=t0) for s in range(REAL)])
    # 1. The sink stores and commits the real messages, then is SIGKILLed while
    #    handling a later message of another sender (inserted, not committed).
    flag = tmp_path / "first-round"
    first = subprocess.Popen(
        [sys.executable, "-c", CRASHING_SINK, "sc", str(flag)],
        cwd=paths.ROOT,
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert flag.exists(), "the sink never inserted the real messages"
        time.sleep(1.5)  # their offsets committed
        publish(settings, [step(0, t0=t0, host="h9", inst="agent-9", job="other-job")])
        out, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == -signal.SIGKILL, out.decode()[-2000:]
    # 2. The forger replays the agent's last number with other content. A new sink
    #    (nothing in memory) replays the uncommitted message, then reads the forgery:
    #    only the store can tell that the number was accepted before.
    publish(settings, [step(REAL - 1, FORGED_S, t0)])
    store = migrated(settings)
    try:
        assert store.query("SELECT count() FROM step_events").scalar() == 2 * REAL + 2
        sink = sink_run(store, settings, 2)
        expect_real_only(holds(store))
        assert store.query("SELECT count() FROM step_events").scalar() == 2 * REAL + 2
        assert sink.metrics.value("stepwatch_sink_duplicate_messages_total") == 1  # the replay
        assert sink.metrics.value("stepwatch_sink_batches_total", kind="replayed") >= 1
    finally:
        store.close()


def test_an_existing_store_migrates_to_the_sender_ledger(tmp_path):
    store = ChdbStore(str(tmp_path / "chdb"))
    try:
        older = [m for m in load_migrations() if m.name != "sender_seqs"]
        Migrator(store, migrations=older).migrate()
        assert store.query("EXISTS TABLE sender_seqs").scalar() == 0
        applied = Migrator(store).migrate()
        assert [m.name for m in applied] == ["sender_seqs"]
        columns = store.query(
            "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
            "AND table = 'sender_seqs' ORDER BY position"
        ).rows
        assert tuple(tuple(c) for c in columns) == R.SENDER_SEQS.columns
    finally:
        store.close()


def long_device_names(n: int) -> list[str]:
    """NIC device names as long as the contract allows (256): 1,200 of them are ~640 KB of keys."""
    return ["mlx5_0", *(f"{'n' * 240}_{i:05d}" for i in range(n))]


def ports(ts: float, host: str, devices: list[str], total: int) -> Record:
    msg = PortMessage(
        host=host,
        ts=ts,
        inst="p",
        seq=int(ts),
        job_id=JOB,
        ports=[PortReading(device=d, port=1, xmit_bytes_total=total) for d in devices],
    )
    return Record("sc.ports", 0, int(ts), encode(msg), host.encode())


def test_many_long_device_names_do_not_cost_the_ports_their_counter_seed(tmp_path):
    """The seed lookup after a restart names every key twice: 1,200 long ones were one
    query over the store's size limit, and no port of the batch got its seed."""
    store = ChdbStore(str(tmp_path / "chdb"))
    try:
        Migrator(store).migrate()
        # 1,250 long names, in messages of 250 ports (a message holds at most 256 devices)
        hosts, devices = ["h1", "h2", "h3", "h4", "h5"], long_device_names(250)
        t0 = float(int(time.time()) - 100)  # whole seconds: ts is stored in ms
        before = Preparer(store).prepare([ports(t0, h, devices, 1000) for h in hosts])
        bucket = before.tables["port_samples"]
        assert len(bucket.rows) == len(hosts) * len(devices)
        store.insert("port_samples", bucket.table.names, bucket.rows)
        # a restarted sink: the previous readings come from the store
        after = Preparer(store).prepare([ports(t0 + 10, h, devices, 2000) for h in hosts])
        names = R.PORTS.names
        got = {
            (row[names.index("ver")], row[names.index("xmit_bytes_per_s")])
            for row in after.tables["port_samples"].rows
        }
        assert got == {(1, 100.0)}  # every port continued its rate across the restart
    finally:
        store.close()
