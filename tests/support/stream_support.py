"""Helpers for the stream-worker integration tests: a `stepwatch stream` subprocess,
publishing to and reading back from the broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from stepwatch.contract import KIND_OF, Message, Topics, encode, message_key
from stepwatch.daemons.process import free_port
from stepwatch.settings import Settings
from tests.support import paths

ROOT = paths.ROOT
Sample = tuple[str, dict[str, str], float]


@dataclass
class StreamWorker:
    """``stepwatch stream`` in a subprocess, with its own metrics port and data dir."""

    settings: Settings
    workdir: Path
    name: str
    app_id: str = "it-stream"
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # over the defaults below
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> StreamWorker:
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "stepwatch.cli",
            "stream",
            "--bootstrap-servers",
            self.settings.bootstrap_servers,
            "--topic-prefix",
            self.settings.topic_prefix,
            "--partitions",
            str(self.settings.partitions),
            "--metrics-port",
            str(self.port),
            "--app-id",
            self.app_id,
            "--worker-name",
            self.name,
            "--data-dir",
            str(self.workdir / self.name),
            "--session-timeout",
            "6",
            *self.extra,
        ]
        env = {**os.environ, "STEPWATCH_HANG_MIN_SECONDS": "3600", **self.env}
        log = open(self.workdir / f"{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
        return self

    @property
    def log(self) -> str:
        return (self.workdir / f"{self.name}.log").read_text(errors="replace")

    def samples(self) -> list[Sample]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return []
        return [
            (s.name, s.labels, s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        return sum(
            v
            for n, lab, v in self.samples()
            if n == name and all(lab.get(k) == x for k, x in labels.items())
        )

    def jobs(self) -> set[str]:
        return {lab["job_id"] for n, lab, _ in self.samples() if n == "stepwatch_job_last_step"}

    def stop(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)


def wait_for(
    what: str, check: Callable[[], object], timeout: float, workers: Iterable[StreamWorker] = ()
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        for w in workers:
            assert w.proc is None or w.proc.poll() is None, f"{w.name} exited:\n{w.log[-3000:]}"
        time.sleep(0.25)
    logs = "\n".join(f"--- {w.name}\n{w.log[-3000:]}" for w in workers)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")


def publish(settings: Settings, items: Iterable[Message | tuple[str, bytes | None, bytes]]) -> int:
    """Produce messages (routed by kind, keyed by job) or raw (topic, key, value) tuples."""
    from confluent_kafka import Producer

    from stepwatch.kafka import producer_config

    topics = Topics(settings.topic_prefix)
    producer = Producer(producer_config(settings, **{"linger.ms": 5}))
    n = 0
    for item in items:
        stamp: dict[str, Any] = {}
        if isinstance(item, tuple):
            topic, key, value = item
        else:
            topic, key, value = (
                topics.for_kind(KIND_OF[type(item)]),
                message_key(item),
                encode(item),
            )
            # record timestamp = event time, as for an agent producing live: the
            # worker's event-time alignment orders a backlog by it
            stamp = {"timestamp": int(item.ts * 1000)}
        producer.produce(topic, value, key=key, **stamp)
        n += 1
        if n % 2000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0, "messages not delivered"
    return n


def read_topic(settings: Settings, topic: str, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """Everything in a topic now: (partition, value), from the beginning up to each
    partition's end offset when called.

    Raises ``AssertionError`` when ``timeout`` passes first: a partial read is never
    returned (it was: a test asserting *no* detection could then pass on a read that
    never reached one, and a fault test could read a miss)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"reader-{time.time()}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
        tps = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
            for p in meta.partitions
        }
        consumer.assign(tps)
        out: list[tuple[int, bytes]] = []
        pos = {p: 0 for p in meta.partitions}
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in pos) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error():
                    continue
                part, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                out.append((part, msg.value() or b""))
                pos[part] = offset + 1
        short = {p: (pos[p], ends[p]) for p in pos if pos[p] < ends[p]}
        assert not short, f"read of {topic} timed out after {timeout} s: {short} (read, end)"
        return out
    finally:
        consumer.close()
