"""The sink's per-sender duplicate filter, its age and producer checks, the store's modes."""

from __future__ import annotations

import os
import stat

import pytest

from stepwatch.contract import DetectionMessage, GpuMessage, StepMessage, StepRecord, encode
from stepwatch.contract.seen import SenderWindow, Verdict
from stepwatch.exporters.clickhouse.permissions import secure_store_dir
from stepwatch.exporters.clickhouse.prepare import Preparer, Record
from stepwatch.exporters.clickhouse.senders import SenderFilter
from stepwatch.exporters.clickhouse.service import per_query_memory
from stepwatch.exporters.clickhouse.sink import SinkConfig
from stepwatch.kafka import client_config
from stepwatch.settings import Settings

pytestmark = pytest.mark.unit

NOW = 1767225600.0


def steps(job: str, seq: int, inst: str = "i1", ts: float = NOW) -> StepMessage:
    return StepMessage(
        host="h1",
        ts=ts,
        inst=inst,
        seq=seq,
        job_id=job,
        steps=[StepRecord(job_id=job, rank=0, world_size=1, step=seq, start=ts - 1, end=ts - 0.5)],
    )


def rec(message, offset: int = 0, topic: str = "t.steps") -> Record:
    return Record(topic, 0, offset, encode(message))


def test_sender_window_duplicate_conflict_and_beyond() -> None:
    w = SenderWindow(8)
    assert w.admit(5, 1) is Verdict.NEW
    assert w.admit(5, 1) is Verdict.DUPLICATE
    assert w.admit(5, 2) is Verdict.CONFLICT
    assert w.admit(5, 2) is Verdict.DUPLICATE  # the later content's repeat
    assert w.admit(3, 7) is Verdict.NEW  # late but new
    assert w.admit(3, 7) is Verdict.DUPLICATE
    assert w.admit(100, 1) is Verdict.NEW
    assert w.admit(5, 1) is Verdict.BEYOND  # too old to tell: stored, never dropped
    assert w.admit(99, 3) is Verdict.NEW and w.admit(99, 3) is Verdict.DUPLICATE


def test_the_filter_is_bounded_by_senders_not_messages() -> None:
    f = SenderFilter(window=64, max_senders=100)
    for n in range(20_000):
        m = steps("j", n // 50, inst=f"i{n % 50}")
        f.admit(m, encode(m))
    assert len(f) == 50
    for k in range(150):
        f.admit(steps("j", 0, inst=f"x{k}"), b"x")
    assert len(f) == 100 and f.evicted == 100


def test_a_forger_sending_first_does_not_suppress_the_real_message() -> None:
    prep = Preparer()
    forged = prep.prepare([rec(steps("forged", 0))])
    real = prep.prepare([rec(steps("real", 0), 1)])
    again = prep.prepare([rec(steps("real", 0), 2)])
    assert len(forged.tables["step_events"].rows) == 1
    assert len(real.tables["step_events"].rows) == 1  # stored too
    assert [row[5] for row in real.dead] == ["seq_conflict"]
    assert again.duplicates == 1 and not again.tables  # a true repeat is still dropped


def test_rows_older_than_the_raw_tables_keep_are_dead_letters() -> None:
    prep = Preparer(now=lambda: NOW, max_age_seconds=90 * 86400)
    old = GpuMessage(host="h", ts=NOW - 200 * 86400, inst="g", seq=0)
    out = prep.prepare([rec(old, 0, "t.gpu"), rec(steps("j", 0), 1)])
    assert [(row[3], row[5]) for row in out.dead] == [(0, "too_old")]
    assert "200 days old" in out.dead[0][6]
    assert len(out.tables["step_events"].rows) == 1


def test_detections_only_from_allowed_producers() -> None:
    def det(id_: str, producer: str) -> DetectionMessage:
        return DetectionMessage(
            host="h", ts=NOW, inst=id_, seq=0, id=id_, job_id="j", type="hang", producer=producer
        )

    prep = Preparer(producers=frozenset({"w1"}))
    out = prep.prepare(
        [rec(det("a", "w1"), 0, "t.detections"), rec(det("b", "evil"), 1, "t.detections")]
    )
    assert [r[1] for r in out.tables["detections"].rows] == ["a"]
    assert [(r[3], r[5]) for r in out.dead] == [(1, "unknown_producer")]
    # a takeover re-emitting a change under another producer is a duplicate, not a conflict
    again = prep.prepare([rec(det("a", "w1"), 2, "t.detections")])
    assert again.duplicates == 1


def test_sink_config_from_settings() -> None:
    s = Settings.load(
        env={"STEPWATCH_STORE_DETECTION_PRODUCERS": "w1, w2", "STEPWATCH_STORE_RAW_TTL_DAYS": "30"}
    )
    cfg = SinkConfig.from_settings(s)
    assert cfg.detection_producers == frozenset({"w1", "w2"}) and cfg.raw_ttl_days == 30
    assert cfg.preparer(None).max_age_seconds == 30 * 86400


def test_kafka_security_settings_reach_the_sinks_consumer() -> None:
    s = Settings.load(
        env={},
        bootstrap_servers="k:9093",
        kafka_config={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "stepwatch-sink",
            "sasl.password": "pw",
            "ssl.ca.location": "/ca.pem",
        },
    )
    conf = client_config(s, {"group.id": "g"}, role="sink")
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.username"] == "stepwatch-sink"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512" and conf["ssl.ca.location"] == "/ca.pem"


def test_memory_per_query_fits_the_total() -> None:
    assert per_query_memory(8 << 30, 2, 4 << 30) == 2 << 30
    assert per_query_memory(1 << 30, 2, 4 << 30) == 1 << 30
    assert per_query_memory(8 << 30, 2, 0) == 8 << 30


def test_an_existing_store_is_tightened(tmp_path) -> None:
    store = tmp_path / "store"
    (store / "data").mkdir(parents=True)
    (store / "data" / "x.bin").write_bytes(b"x")
    os.chmod(store, 0o755)
    os.chmod(store / "data", 0o755)
    os.chmod(store / "data" / "x.bin", 0o644)
    assert secure_store_dir(str(store), create=False) == 3
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store / "data" / "x.bin").st_mode) == 0o600
    assert secure_store_dir(str(store), create=False) == 0
    fresh = tmp_path / "fresh"
    secure_store_dir(str(fresh), create=True)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700
