"""The real agent process -> the real broker -> a consumer: every message arrives.

A fake rank sends step datagrams through the agent's real Unix socket; the
agent runs as ``stepwatch agent`` (a subprocess) with whichever host
collectors exist in this build (``nvml-replay``, ``rdma`` over the sysfs
fixture tree); it is stopped with SIGTERM and must exit cleanly after
delivering everything.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stepwatch.audit import SeqAudit
from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    Message,
    PortMessage,
    StepMessage,
    StepRecord,
    Topics,
    decode,
)
from stepwatch.contract.wire import RankEvent, RankStep, encode_datagram
from stepwatch.daemons.process import free_port
from stepwatch.settings import Settings
from tests.support import paths

ROOT = paths.ROOT
SYSFS = ROOT / "tests" / "fixtures" / "sysfs"
JOB = "job-it"


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def host_collectors() -> list[str]:
    names = []
    if available("stepwatch.agents.collectors.nvml_replay"):
        names.append("nvml-replay")
    if available("stepwatch.agents.collectors.rdma") and (SYSFS / "class" / "infiniband").is_dir():
        names.append("rdma")
    return names


def read_topics(
    bootstrap: str, topics: list[str], want: int, timeout: float = 30.0
) -> list[tuple[str, int, bytes, Message]]:
    """Everything in ``topics`` from the beginning (assign, no group join), until ``want``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"it-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        meta = consumer.list_topics(timeout=10).topics
        consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        )
        out: list[tuple[str, int, bytes, Message]] = []
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    out.append(
                        (
                            msg.topic() or "",
                            msg.partition() or 0,
                            msg.key() or b"",
                            decode(msg.value() or b""),
                        )
                    )
        return out
    finally:
        consumer.close()


def wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not seen; agent log:\n{path.read_text()}")


def metric(port: int, line_start: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


@pytest.mark.timeout(120)
def test_agent_delivers_every_step_and_sample(settings: Settings, tmp_path: Path) -> None:
    collectors = ["steps", *host_collectors()]
    port = free_port()
    log_path = tmp_path / "agent.log"
    cmd = [
        sys.executable,
        "-m",
        "stepwatch.cli",
        "agent",
        "--bootstrap-servers",
        settings.bootstrap_servers,
        "--topic-prefix",
        "t",
        "--partitions",
        "4",
        "--host",
        "node-it",
        "--collectors",
        ",".join(collectors),
        "--socket",
        settings.agent_socket,
        "--spool-dir",
        settings.spool_dir,
        "--sysfs-root",
        str(SYSFS),
        "--tick",
        "0.2",
        "--metrics-port",
        str(port),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        wait_for(log_path, "agent ready", proc)
        wait_for(log_path, "kafka ready", proc)
        sent = send_rank_traffic(settings.agent_socket)
        time.sleep(0.6)  # a few more ticks
        assert (
            metric(port, 'stepwatch_agent_datagrams_rejected_total{reason="malformed_json"}') == 1
        )
        assert metric(port, "stepwatch_agent_ready") == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    log_text = log_path.read_text()
    assert "agent stopped" in log_text and "undelivered_in_spool=0" in log_text

    topics = Topics("t")
    got = read_topics(
        settings.bootstrap_servers,
        list(topics.telemetry()),
        want=expected_count(log_text),
        timeout=20,
    )
    messages = [m for *_, m in got]
    audit = SeqAudit()
    for m in messages:
        audit.add(m)
    report = audit.report()
    assert report.missing == 0 and report.duplicates == 0, report
    assert report.messages == expected_count(log_text)

    steps = {
        (r.job_id, r.rank, r.step) for m in messages if isinstance(m, StepMessage) for r in m.steps
    }
    assert steps == sent
    for topic, _part, key, m in got:
        assert m.host == "node-it"
        if isinstance(m, StepMessage):
            assert topic == topics.steps and key == JOB.encode()
            assert {r.host for r in m.steps} == {"node-it"}
    events = [m for m in messages if isinstance(m, EventMessage)]
    assert [(e.type, e.job_id, e.rank) for e in events] == [(EventType.CHECKPOINT_SAVE, JOB, 0)]
    if "nvml-replay" in collectors:
        gpu = [m for m in messages if isinstance(m, GpuMessage)]
        assert gpu and any(m.job_id == JOB for m in gpu)  # attributed once steps arrived
    if "rdma" in collectors:
        assert any(isinstance(m, PortMessage) and m.ports for m in messages)


def expected_count(log_text: str) -> int:
    """Messages the agent produced, from its own counters at the end of the log."""
    for line in reversed(log_text.splitlines()):
        if "agent stopped" in line and "messages=" in line:
            return int(line.split("messages=")[1].split()[0].strip('"'))
    raise AssertionError("no final message count in the agent log")


def send_rank_traffic(path: str) -> set[tuple[str, int, int]]:
    """Two ranks, 15 steps each at ~20 Hz, one garbage datagram, one checkpoint event."""
    sent: set[tuple[str, int, int]] = set()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"{this is not json", path)
        for step in range(15):
            now = time.time()
            for rank in (0, 1):
                rec = StepRecord(
                    job_id=JOB,
                    rank=rank,
                    world_size=16,
                    step=step,
                    start=now - 0.05,
                    end=now,
                    local_rank=rank,
                )
                sock.sendto(encode_datagram(RankStep(step=rec)), path)
                sent.add((JOB, rank, step))
            time.sleep(0.05)
        event = RankEvent(type=EventType.CHECKPOINT_SAVE, ts=time.time(), job_id=JOB, rank=0)
        sock.sendto(encode_datagram(event), path)
    return sent


@pytest.mark.timeout(60)
def test_broker_command_serves_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "broker.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "broker",
                "--port",
                str(port),
                "--create-topics",
                "--partitions",
                "2",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        wait_for(out, f"export STEPWATCH_BOOTSTRAP_SERVERS=127.0.0.1:{port}", proc)
        settings = Settings.load(env={}, bootstrap_servers=f"127.0.0.1:{port}")
        from confluent_kafka.admin import AdminClient

        meta = AdminClient({"bootstrap.servers": settings.bootstrap_servers}).list_topics(
            timeout=10
        )
        assert len(meta.topics[Topics().steps].partitions) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # the broker went with it


@pytest.mark.timeout(60)
def test_agent_with_dev_broker_starts_and_stops_cleanly(tmp_path: Path) -> None:
    log_path = tmp_path / "agent.log"
    cmd = [
        sys.executable,
        "-m",
        "stepwatch.cli",
        "agent",
        "--dev-broker",
        "--collectors",
        "steps",
        "--socket",
        str(tmp_path / "a.sock"),
        "--spool-dir",
        str(tmp_path / "spool"),
        "--tick",
        "0.2",
        "--metrics-port",
        "0",
    ]
    env = {k: v for k, v in os.environ.items() if k != "STEPWATCH_BOOTSTRAP_SERVERS"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT)},
        )
    try:
        wait_for(log_path, "kafka ready", proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_path.read_text()
    assert "development broker started" in text and "broker stopped" in text
    assert not (tmp_path / "a.sock").exists()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("problem", ["tls-mismatch", "unreachable"])
def test_agent_that_never_reaches_kafka_says_so_in_logs_and_metrics(
    broker, tmp_path: Path, problem: str
) -> None:
    """A TLS setting against a plaintext broker, or nothing listening: never "kafka ready"."""
    port = free_port()
    log_path = tmp_path / "agent.log"
    if problem == "tls-mismatch":
        kafka = ["--bootstrap-servers", broker.bootstrap, "-X", "security.protocol=SSL"]
    else:
        kafka = ["--bootstrap-servers", f"127.0.0.1:{free_port()}"]
    cmd = [
        sys.executable,
        "-m",
        "stepwatch.cli",
        "agent",
        *kafka,
        "--topic-prefix",
        "t",
        "--collectors",
        "steps",
        "--socket",
        str(tmp_path / "a.sock"),
        "--spool-dir",
        str(tmp_path / "spool"),
        "--tick",
        "0.2",
        "--web-listen-address",
        f"127.0.0.1:{port}",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        wait_for(log_path, "agent ready", proc)
        wait_for(log_path, "kafka unreachable", proc)
        assert metric(port, "stepwatch_agent_kafka_ready") == 0
        assert metric(port, "stepwatch_agent_kafka_last_success_timestamp_seconds") == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_path.read_text()
    assert "kafka ready" not in text and "last_success=never" in text
    assert not [line for line in text.splitlines() if line.startswith("%")]  # no raw librdkafka
