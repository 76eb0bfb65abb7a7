"""The sink's per-sender duplicate filter, its age and producer checks, the store's modes."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from stepwatch.contract import DetectionMessage, GpuMessage, StepMessage, StepRecord, encode
from stepwatch.contract.seen import SenderWindow, Verdict
from stepwatch.exporters.clickhouse.accepted import lookup_accepted, sender_key
from stepwatch.exporters.clickhouse.permissions import secure_store_dir
from stepwatch.exporters.clickhouse.prepare import Preparer, Record
from stepwatch.exporters.clickhouse.senders import SenderFilter, content_digest
from stepwatch.exporters.clickhouse.service import per_query_memory
from stepwatch.exporters.clickhouse.sink import SinkConfig
from stepwatch.exporters.clickhouse.store import Result
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


def test_a_replay_with_other_content_is_dead_lettered_and_the_first_content_stays() -> None:
    prep = Preparer()
    real = prep.prepare([rec(steps("real", 0), 0)])
    forged = prep.prepare([rec(steps("forged", 0), 1)])
    forged_again = prep.prepare([rec(steps("forged", 0), 2)])
    real_again = prep.prepare([rec(steps("real", 0), 3)])
    assert [r[0] for r in real.tables["step_events"].rows] == ["real"]
    assert not forged.tables and not forged_again.tables  # never inserted: FINAL, rollups
    assert [(row[3], row[5]) for row in forged.dead] == [(1, "seq_conflict")]
    assert "not stored" in forged.dead[0][6] and '"forged"' in forged.dead[0][7]
    assert [row[5] for row in forged_again.dead] == ["seq_conflict"]  # each try is flagged
    assert real_again.duplicates == 1 and not real_again.tables and not real_again.dead
    assert [a[1:5] for a in real.accepted] == [("h1", "i1", "step", 0)]  # noted for the store
    assert not forged.accepted and not real_again.accepted


def test_a_conflict_in_one_batch_keeps_the_first_of_the_batch() -> None:
    out = Preparer().prepare([rec(steps("real", 7), 0), rec(steps("forged", 7), 1)])
    assert [r[0] for r in out.tables["step_events"].rows] == ["real"]
    assert [(row[3], row[5]) for row in out.dead] == [(1, "seq_conflict")]


def test_the_filter_keeps_the_first_content_and_defers_to_the_store() -> None:
    f = SenderFilter(window=8)
    real, forged = steps("real", 3), steps("forged", 3)
    assert f.admit(real, encode(real)) is Verdict.NEW
    assert f.admit(forged, encode(forged)) is Verdict.CONFLICT
    assert f.admit(forged, encode(forged)) is Verdict.CONFLICT  # the slot kept the first
    assert f.admit(real, encode(real)) is Verdict.DUPLICATE
    # a fresh filter (a restarted sink) told what the store accepted for the number
    fresh = SenderFilter(window=8)
    stored = frozenset({content_digest(real, encode(real))})
    assert fresh.admit(forged, encode(forged), stored) is Verdict.CONFLICT
    assert fresh.admit(real, encode(real), stored) is Verdict.DUPLICATE
    assert fresh.admit(forged, encode(forged)) is Verdict.CONFLICT  # memory learnt the first


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


class LedgerStore:
    """A store whose sender_seqs holds the given rows (key, host, inst, kind, seq, digest)."""

    backend = "fake"
    database = "t"

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def query(self, sql: str, params: Any = None) -> Result:
        if "FROM sender_seqs" not in sql:
            return Result((), (), [])
        asked = {int(k) for k in sql.split("IN (")[1].rstrip(")").split(", ")}
        return Result((), (), [r[1:6] for r in self.rows if r[0] in asked])


def test_a_restarted_sink_asks_the_store_what_was_accepted() -> None:
    real, forged = steps("real", 4), steps("forged", 4)
    noted = Preparer().prepare([rec(real)]).accepted  # what the first sink wrote
    restarted = Preparer(LedgerStore([r[:6] for r in noted]))  # type: ignore[arg-type]
    out = restarted.prepare([rec(forged, 1), rec(real, 2)])
    assert not out.tables and out.duplicates == 1  # nothing inserted
    assert [(row[3], row[5]) for row in out.dead] == [(1, "seq_conflict")]


def test_a_key_collision_in_the_store_is_not_taken_for_the_number() -> None:
    real = steps("real", 4)
    (row,) = Preparer().prepare([rec(real)]).accepted
    collision = (row[0], "other-host", "i1", "step", 4 + (1 << 24), 99)  # same key, not the number
    assert sender_key(("other-host", "i1", "step", 4)) != row[0]
    prep = Preparer(LedgerStore([collision]))  # type: ignore[arg-type]
    assert len(prep.prepare([rec(real)]).tables["step_events"].rows) == 1
    assert lookup_accepted(LedgerStore([collision]), [row[1:5]]).found == {}  # type: ignore[arg-type]
