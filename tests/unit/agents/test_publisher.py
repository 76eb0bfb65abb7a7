"""The spool-backed publisher against a scripted fake producer and an unreachable broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stepwatch.agents.publisher import BrokerState, KafkaPublisher
from stepwatch.agents.sink import MessageSink, Sequencer
from stepwatch.agents.spool import Spool
from stepwatch.contract import GpuMessage, GpuReading, Message, StepMessage, StepRecord, decode
from stepwatch.errors import TransportError
from stepwatch.settings import Settings

NOW = time.time()


class Err:
    def __init__(self, name: str, fatal: bool = False) -> None:
        self._name, self._fatal = name, fatal

    def name(self) -> str:
        return self._name

    def fatal(self) -> bool:
        return self._fatal

    def __str__(self) -> str:
        return self._name


class FakeCluster:
    """Stands in for Kafka: what was delivered, and how the next producer behaves."""

    def __init__(self) -> None:
        self.delivered: list[tuple[str, bytes, bytes]] = []
        self.reachable = True
        self.mode = "ok"  # ok | fail | hold
        self.reverse = False  # deliver each poll's batch in reverse (as across partitions)
        self.reject: set[bytes] = set()  # values refused permanently
        self.fail_once: set[bytes] = set()  # values whose first delivery fails
        self.producers: list[FakeProducer] = []
        self.timestamps: list[int] = []  # record timestamps asked for, in produce order
        self.lock = threading.Lock()

    def factory(self, config: dict[str, Any]) -> FakeProducer:
        p = FakeProducer(self, config)
        self.producers.append(p)
        return p

    def probe(self) -> None:
        if not self.reachable:
            raise TransportError("cannot list topics: unreachable")


class FakeProducer:
    def __init__(self, cluster: FakeCluster, config: dict[str, Any]) -> None:
        self.cluster, self.config = cluster, config
        self.queue: list[tuple[str, bytes, bytes, Callable[..., None]]] = []

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes,
        on_delivery: Callable[..., None],
        timestamp: int = 0,
    ) -> None:
        self.queue.append((topic, key, value, on_delivery))
        self.cluster.timestamps.append(timestamp)

    def poll(self, timeout: float = 0) -> int:
        c = self.cluster
        if c.mode == "hold" or not self.queue:
            time.sleep(min(timeout, 0.005))
            return 0
        items, self.queue = self.queue, []
        if c.reverse:
            items.reverse()
        for topic, key, value, cb in items:
            if c.mode == "fail" or value in c.fail_once:
                c.fail_once.discard(value)
                cb(Err("_MSG_TIMED_OUT"), None)
            elif value in c.reject:
                cb(Err("MSG_SIZE_TOO_LARGE"), None)
            else:
                with c.lock:
                    c.delivered.append((topic, key, value))
                cb(None, None)
        return len(items)

    def purge(self) -> None:
        items, self.queue = self.queue, []
        for *_, cb in items:
            cb(Err("_PURGE_QUEUE"), None)

    def flush(self, timeout: float = 0) -> int:
        return 0


def messages(n: int, hosts: int = 3, seq: Sequencer | None = None) -> list[Message]:
    seq = seq or Sequencer("inst0")
    out: list[Message] = []
    for i in range(n):
        host = f"node{i % hosts:02d}"
        if i % 2:
            out.append(seq.stamp(GpuMessage(host=host, ts=NOW, gpus=[GpuReading(index=0)])))
        else:
            rec = StepRecord(
                job_id="job-1", rank=i % 8, world_size=8, step=i, start=NOW - 1, end=NOW, host=host
            )
            out.append(seq.stamp(StepMessage(host=host, ts=NOW, job_id="job-1", steps=[rec])))
    return out


def received(cluster: FakeCluster) -> list[tuple[str, int]]:
    out = []
    for _, _, value in cluster.delivered:
        m = decode(value)
        out.append((f"{m.host}/{m.inst}/{type(m).__name__}", m.seq))
    return out


def settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings.load(
        env={},
        bootstrap_servers="fake:9092",
        topic_prefix="t",
        spool_dir=str(tmp_path / "spool"),
        host="h",
        **kw,
    )


@pytest.fixture()
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture()
def publisher(tmp_path: Path, cluster: FakeCluster) -> Iterator[KafkaPublisher]:
    pub = KafkaPublisher(settings(tmp_path), producer_factory=cluster.factory, probe=cluster.probe)
    yield pub
    pub.close(timeout=1)


def test_is_a_message_sink(publisher: KafkaPublisher) -> None:
    assert isinstance(publisher, MessageSink)


def test_everything_delivered_in_order_with_topic_and_key(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    msgs = messages(300)
    publisher.send(msgs[:100])
    publisher.send(msgs[100:])
    assert publisher.flush(5) == 0
    got = cluster.delivered
    assert len(got) == 300
    assert [(t, k) for t, k, _ in got[:2]] == [("t.steps", b"job-1"), ("t.gpu", b"node01")]
    assert [decode(v) for _, _, v in got] == msgs
    stats = publisher.stats()
    assert stats.produced == {"step": 150, "gpu": 150} == stats.accepted
    assert stats.spool.records == 0 and stats.state is BrokerState.UP


def test_record_timestamp_is_the_event_time(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    msgs = [msgspec.structs.replace(m, ts=NOW - 100 + i) for i, m in enumerate(messages(20))]
    publisher.send(msgs)
    assert publisher.flush(5) == 0
    assert cluster.timestamps == [int((NOW - 100 + i) * 1000) for i in range(20)]


def test_ack_waits_for_the_oldest_report(publisher: KafkaPublisher, cluster: FakeCluster) -> None:
    cluster.reverse = True  # reports come back newest first
    publisher.send(messages(50))
    assert publisher.flush(5) == 0
    assert publisher.spool.acked.record == 50


def test_failed_delivery_rewinds_and_resends_on_a_fresh_producer(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    publisher.send(messages(20))
    assert publisher.flush(5) == 0
    cluster.mode = "fail"
    publisher.send(messages(30, seq=Sequencer("inst1")))
    deadline = time.monotonic() + 5
    while not publisher.stats().delivery_failures and time.monotonic() < deadline:
        time.sleep(0.01)
    cluster.mode = "ok"
    assert publisher.flush(5) == 0
    got = received(cluster)
    assert len(got) == len(set(got)) == 50  # nothing lost, nothing twice
    stats = publisher.stats()
    assert stats.delivery_failures["_MSG_TIMED_OUT"] >= 1
    assert stats.producer_resets >= 1 and stats.rewinds >= 1
    assert len(cluster.producers) >= 2


def test_resend_after_a_partial_failure_skips_what_landed(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    from stepwatch.contract import encode

    msgs = messages(10)
    cluster.fail_once = {encode(msgs[3]), encode(msgs[7])}
    publisher.send(msgs)
    assert publisher.flush(5) == 0
    got = received(cluster)
    assert len(got) == len(set(got)) == 10  # 3 and 7 resent, 4-6 and 8-9 not again
    assert publisher.stats().extra["resends_skipped"] == 5
    assert publisher.spool.acked.record == 10


def test_unreachable_cluster_spools_then_catches_up_in_order(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    cluster.reachable = False
    pub = KafkaPublisher(settings(tmp_path), producer_factory=cluster.factory, probe=cluster.probe)
    try:
        msgs = messages(40)
        pub.send(msgs)
        assert pub.flush(0.3) == 40
        assert pub.state is BrokerState.DOWN and cluster.producers == []
        assert pub.stats().spool.records == 40
        cluster.reachable = True
        assert pub.flush(10) == 0
        assert [decode(v) for _, _, v in cluster.delivered] == msgs
    finally:
        pub.close(timeout=1)


def test_all_brokers_down_blip_recovers_without_reset(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    publisher.send(messages(10))
    assert publisher.flush(5) == 0
    producer = cluster.producers[-1]
    producer.config["error_cb"](Err("_ALL_BROKERS_DOWN"))
    assert publisher.state is BrokerState.SUSPECT
    publisher.send(messages(10, seq=Sequencer("inst1")))
    assert publisher.flush(5) == 0
    assert publisher.state is BrokerState.UP
    assert len(cluster.producers) == 1 and len(cluster.delivered) == 20


def test_broker_down_then_back_resends_what_was_in_flight(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    cluster.mode = "hold"  # produced, never confirmed
    publisher.send(messages(10))
    time.sleep(0.1)
    cluster.reachable = False
    cluster.producers[-1].config["error_cb"](Err("_ALL_BROKERS_DOWN"))
    publisher.send(messages(10, seq=Sequencer("inst1")))
    assert publisher.flush(0.5) == 20
    assert publisher.state is BrokerState.DOWN
    cluster.mode, cluster.reachable = "ok", True
    assert publisher.flush(10) == 0
    assert sorted(received(cluster)) == sorted(set(received(cluster)))
    assert len(received(cluster)) == 20


def test_stuck_in_flight_after_a_blip_is_reset_after_the_grace(
    publisher: KafkaPublisher, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stepwatch.agents.publisher

    monkeypatch.setattr(stepwatch.agents.publisher, "GRACE_SECONDS", 0.3)
    probes = []
    real_probe = cluster.probe

    def probe() -> None:
        probes.append(1)
        real_probe()

    monkeypatch.setattr(publisher, "_probe", probe)
    cluster.mode = "hold"  # the broker came back but the producer's records never land
    publisher.send(messages(5))
    time.sleep(0.1)
    cluster.producers[-1].config["error_cb"](Err("_ALL_BROKERS_DOWN"))
    time.sleep(0.15)
    assert publisher.state is BrokerState.SUSPECT and len(probes) == 1  # probed once, waiting
    deadline = time.monotonic() + 5
    while len(cluster.producers) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    cluster.mode = "ok"
    assert publisher.flush(5) == 0
    assert len(cluster.producers) == 2 and len(probes) == 1
    assert (
        sorted(received(cluster)) == sorted(set(received(cluster))) and len(received(cluster)) == 5
    )


def test_permanently_rejected_record_is_dropped_and_counted(
    publisher: KafkaPublisher, cluster: FakeCluster
) -> None:
    msgs = messages(5)
    from stepwatch.contract import encode

    cluster.reject.add(encode(msgs[2]))
    publisher.send(msgs)
    assert publisher.flush(5) == 0
    assert len(cluster.delivered) == 4
    stats = publisher.stats()
    assert stats.rejected == 1 and stats.spool.dropped["rejected"] == 1


def test_pending_records_survive_close_and_reopen(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.reachable = False
    pub = KafkaPublisher(settings(tmp_path), producer_factory=cluster.factory, probe=cluster.probe)
    msgs = messages(25)
    pub.send(msgs)
    pub.close(timeout=0.2)
    cluster.reachable = True
    again = KafkaPublisher(
        settings(tmp_path), producer_factory=cluster.factory, probe=cluster.probe
    )
    try:
        assert again.flush(5) == 0
        assert [decode(v) for _, _, v in cluster.delivered] == msgs
    finally:
        again.close(timeout=1)


@pytest.mark.timeout(60)
def test_real_producer_with_unreachable_bootstrap_spools_instead_of_losing(tmp_path: Path) -> None:
    s = Settings.load(
        env={},
        bootstrap_servers="127.0.0.1:1",
        topic_prefix="t",
        spool_dir=str(tmp_path / "spool"),
        host="h",
    )
    pub = KafkaPublisher(s, probe_timeout=0.5)
    msgs = messages(100)
    t0 = time.monotonic()
    pub.send(msgs)
    assert time.monotonic() - t0 < 0.5  # send never waits on the network
    assert pub.flush(1.0) == 100
    assert pub.state is BrokerState.DOWN
    pub.close(timeout=0.5)
    spool = Spool(tmp_path / "spool", s.spool_max_bytes)
    assert [decode(value) for _t, _k, value, _e, _ts in spool.read(1000)] == msgs


def _unreachable_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "stepwatch.agents.publisher" and "kafka unreachable" in r.getMessage()
    ]


def _wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kafka_config",
    [{}, {"security.protocol": "no-such-protocol"}],
    ids=["unreachable-bootstrap", "bad-X-setting"],
)
def test_kafka_that_never_works_is_logged_at_once_and_periodically(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    kafka_config: dict[str, str],
) -> None:
    from stepwatch.agents import publisher as P

    monkeypatch.setattr(P, "DOWN_LOG_EVERY", 0.3)
    monkeypatch.setattr(P, "BACKOFF_MAX", 0.2)
    caplog.set_level("WARNING", logger="stepwatch.agents.publisher")
    s = Settings.load(
        env={},
        bootstrap_servers="127.0.0.1:1",
        topic_prefix="t",
        spool_dir=str(tmp_path / "spool"),
        host="h",
        kafka_config=kafka_config,
    )
    pub = KafkaPublisher(s, probe_timeout=0.3)
    try:
        pub.send(messages(5))
        assert _wait_for(lambda: len(_unreachable_warnings(caplog)) >= 3)
        first = _unreachable_warnings(caplog)[0]
        assert "last_success=never" in first and "bootstrap=127.0.0.1:1" in first
        if kafka_config:
            assert any(
                "no-such-protocol" in w or "security.protocol" in w
                for w in _unreachable_warnings(caplog)
            )
        stats = pub.stats()
        assert stats.state is BrokerState.DOWN and stats.last_success == 0.0
    finally:
        pub.close(timeout=0.3)


def test_readiness_and_last_success_reach_the_agent_metrics(
    tmp_path: Path, cluster: FakeCluster
) -> None:
    from stepwatch.agents.metrics import _publisher

    cluster.reachable = False
    pub = KafkaPublisher(settings(tmp_path), producer_factory=cluster.factory, probe=cluster.probe)
    try:
        pub.send(messages(4))
        pub.flush(0.2)

        def gauges() -> dict[str, float]:
            return {
                m.name: m.samples[0].value
                for m in _publisher(pub.stats())
                if m.type == "gauge" and m.samples
            }

        before = gauges()
        assert before["stepwatch_agent_kafka_ready"] == 0
        assert before["stepwatch_agent_kafka_last_success_timestamp_seconds"] == 0
        cluster.reachable = True
        assert pub.flush(10) == 0
        after = gauges()
        assert after["stepwatch_agent_kafka_ready"] == 1
        assert after["stepwatch_agent_kafka_last_success_timestamp_seconds"] >= NOW
    finally:
        pub.close(timeout=1)


def test_probe_backoff_is_jittered_so_agents_do_not_retry_in_lockstep() -> None:
    import random

    from stepwatch.agents.publisher import JITTER, jittered

    waits = [jittered(4.0, random.Random(seed)) for seed in range(200)]
    assert all(4.0 * (1 - JITTER) <= w <= 4.0 * (1 + JITTER) for w in waits)
    assert len({round(w, 3) for w in waits}) > 150  # agents started together spread out
    assert max(waits) - min(waits) > 2.0
