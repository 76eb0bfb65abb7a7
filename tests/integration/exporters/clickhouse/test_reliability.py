"""Crash, replay, bad rows: the store ends up with every event exactly once.

A sink process is SIGKILLed between its inserts and its offset commit; a
second sink (the CLI, batching differently) takes over the consumer group,
replays the uncommitted batches at the same offsets (so ClickHouse drops the
repeated inserts), finishes, and stops cleanly on SIGTERM. Exactness is
proven with the agents' sequence numbers. Bad records (schema drift, a value
overflowing its column, a future contract version, broken JSON) end in the
dead-letter table with their reason, never silently dropped.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request

import msgspec
import pytest

from stepwatch.contract import Phases, StepMessage, StepRecord, Topics, encode
from stepwatch.daemons.process import free_port
from stepwatch.exporters.clickhouse.access import open_reader
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.service import Endpoint, endpoint_path
from stepwatch.exporters.clickhouse.sink import sink_topics
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings
from tests.support import paths
from tests.support import store_testdata as D

ROOT = paths.ROOT
GROUP = "reliability"

# Runs the real sink with a hook that kills the process (SIGKILL: no flush, no
# commit, no goodbye to the group) right after the N-th round of inserts.
CRASHING_SINK = """
import os, signal, sys
from stepwatch.exporters.clickhouse.runner import run_sink
from stepwatch.contract.topics import STEPS, unprefixed
from stepwatch.exporters.clickhouse.sink import SinkConfig
from stepwatch.settings import Settings
rounds = 0
def crash(batches):
    # counts the rounds that stored step rows: on a loaded machine the first rounds may hold
    # only other topics' partitions, and the test needs some, not all, steps stored
    global rounds
    rounds += any(unprefixed(b.topic) == STEPS for b in batches)
    if rounds == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
run_sink(Settings.load(), SinkConfig(group_id=sys.argv[2], batch_messages=int(sys.argv[3]),
         batch_seconds=0.2, poll_max=300), after_insert=crash)
"""


def bad_records(prefix: str) -> list[tuple[str, bytes]]:
    def step(seq: int, **rec: object) -> StepMessage:
        record = StepRecord(
            job_id="jobX",
            rank=0,
            world_size=2,
            step=seq,
            start=D.T0 + seq,
            end=D.T0 + seq + 1,
            phases=Phases(forward=0.5),
            **rec,
        )  # type: ignore[arg-type]
        return StepMessage(
            host="bad-host", ts=D.T0 + seq + 1, inst="bad", seq=seq, job_id="jobX", steps=[record]
        )

    topic = Topics(prefix).steps
    drift = encode(step(0)).replace(b'"world_size":2', b'"world_size":"two"')
    overflow = encode(step(1, gpu=70000))  # valid JSON and contract, too big for UInt16
    future = encode(msgspec.structs.replace(step(2), v=99))
    broken = b'{"kind":"step","host":"bad-host","inst":"bad","seq":3,"ts":\x00\xff'  # not UTF-8
    return [(topic, drift), (topic, overflow), (topic, future), (topic, broken)]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(150)
def test_sigkill_between_insert_and_commit_then_restart_stores_everything_once(broker, tmp_path):
    messages = D.messages()
    expected = D.expected_rows(messages)
    store_path = str(tmp_path / "chdb")
    env = {
        **os.environ,
        "STEPWATCH_BOOTSTRAP_SERVERS": broker.bootstrap,
        "STEPWATCH_TOPIC_PREFIX": "r",
        "STEPWATCH_PARTITIONS": "4",
        "STEPWATCH_STORE_PATH": store_path,
        "STEPWATCH_STORE_RAW_TTL_DAYS": "20000",
        "STEPWATCH_SINK_METRICS_PORT": "0",
        "STEPWATCH_KAFKA__SESSION_TIMEOUT_MS": "6000",
        "STEPWATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
    }
    settings = Settings.load(env=env)
    ensure_topics(settings, sink_topics("r"))
    D.produce(broker.bootstrap, "r", messages, bad_records("r"))

    # 1. The first sink dies after its second round of inserts, before committing it.
    first = subprocess.run(
        [sys.executable, "-c", CRASHING_SINK, "2", GROUP, "150"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=90,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-2000:]
    with ChdbStore(store_path, readonly=True) as partial:
        written = partial.query("SELECT count() FROM step_events").scalar()
        planned = partial.query("SELECT count() FROM sink_batches").scalar()
    assert 0 < written < expected["step_events"] and planned > 0

    # 2. The CLI sink, with other batch sizes, takes over the group and finishes.
    port = free_port()
    second = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepwatch.cli",
            "db",
            "sink",
            "--group",
            GROUP,
            "--batch-messages",
            "401",
            "--batch-seconds",
            "0.2",
            "--metrics-port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def owner_is_second() -> bool:  # the killed sink left a stale endpoint file behind
            endpoint = Endpoint.read(endpoint_path(store_path))
            return endpoint is not None and endpoint.pid == second.pid

        wait_for(owner_is_second, 30, "the new sink's endpoint")
        reader = open_reader(settings)  # through the running sink's endpoint
        try:
            assert reader.backend == "clickhouse-connect"
            wait_for(lambda: table_counts(reader) == expected, 90, f"rows {expected}")
            wait_for(
                lambda: reader.query("SELECT count() FROM dead_letters").scalar() == 4,
                10,
                "dead letters",
            )
        finally:
            reader.close()
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
        assert metric(metrics, 'stepwatch_sink_batches_total{kind="replayed"}') >= 1
        assert metric(metrics, "stepwatch_sink_ready") == 1
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert second.returncode == 0, out.decode()[-2000:]
    assert "sink stopped" in out.decode() and not endpoint_path(store_path).exists()

    # 3. Exactly once, proven with the senders' sequence numbers, and nothing lost silently.
    with ChdbStore(store_path, readonly=True) as store:
        assert table_counts(store) == expected  # raw counts, no FINAL: no duplicate was inserted
        steps = [m for m in messages if isinstance(m, StepMessage)]
        distinct = store.query("SELECT uniqExact(host, inst, seq) FROM step_events").scalar()
        assert distinct == len(steps)
        assert (
            store.query("SELECT sum(rank_steps) FROM step_rollup_1m").scalar()
            == expected["step_events"]
        )
        completeness = store.query(
            "SELECT kind, sum(messages), sum(gaps) FROM (SELECT 'gpu' AS kind, host, inst, "
            "uniqExact(seq) AS messages, max(seq) - min(seq) + 1 - uniqExact(seq) AS gaps "
            "FROM gpu_samples GROUP BY host, inst) GROUP BY kind"
        ).rows
        assert completeness == [
            ("gpu", sum(1 for m in messages if type(m).__name__ == "GpuMessage"), 0)
        ]
        dead = store.query("SELECT seq, reason, detail FROM dead_letters ORDER BY seq").rows
        kept = store.query(
            "SELECT payload, payload_encoding, payload_truncated FROM dead_letters WHERE seq = 3"
        ).rows
    # the payload as sent, byte for byte (before: 00 FF stored as 00 EF BF BD)
    assert [(base64.b64decode(p), e, t) for p, e, t in kept] == [
        (bad_records("r")[3][1], "base64", False)
    ]
    assert [(seq, reason) for seq, reason, _ in dead] == [
        (0, "schema"),
        (1, "overflow"),
        (2, "unsupported_version"),
        (3, "malformed_json"),
    ]
    # the overflow is the contract's bound (the same the stream worker applies): UInt16's 65535
    assert "world_size" in dead[0][2] and "gpu" in dead[1][2] and "65535" in dead[1][2]


def table_counts(store) -> dict[str, int]:
    return {
        t: store.query(f"SELECT count() FROM {t}").scalar()
        for t in ("step_events", "gpu_samples", "port_samples", "events", "detections")
    }


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
