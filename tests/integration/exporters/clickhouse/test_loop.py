"""The whole loop into the store: detections, alerts and remediation actions, one time axis.

A real broker, the real sink and the real embedded store. A detection is
published as a stream worker does; an Alertmanager webhook (firing, then
resolved) is posted to the alert receiver, which publishes to ``<prefix>.alerts``;
the remediator's audit publishes its decision on ``<prefix>.remediations``. The
sink writes all three; ``job_timeline`` returns them in time order and the
report's alert and action lanes are not empty. A second test has the real
Alertmanager deliver the webhook to the receiver.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from stepwatch.alerts.config import Receivers, alertmanager_config
from stepwatch.alerts.receiver import AlertReceiver, KafkaPublisher
from stepwatch.alerts.remediate.audit import KafkaWriter
from stepwatch.alerts.remediate.model import ActionKind, Decision, Mode, Outcome
from stepwatch.contract import DetectionMessage, Phases, StepMessage, StepRecord, Topics
from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.kafka import ensure_topics, producer_config
from stepwatch.settings import Settings
from tests.support import store_testdata as D
from tests.support.alert_support import WebhookReceiver

pytestmark = pytest.mark.integration
TOKEN = "loop-token"
JOB = "jobL"
T0 = float(int(time.time()) - 600)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def webhook(status: str, starts: float, ends: float | None) -> bytes:
    alert = {
        "status": status,
        "fingerprint": "fp-node02-straggler",
        "labels": {
            "alertname": "StragglerPersistent",
            "job_id": JOB,
            "host": "node02",
            "severity": "page",
            "cause": "gpu",
            "class": "system",
        },
        "annotations": {"summary": "rank 3 on node02 is a straggler"},
        "startsAt": _iso(starts),
        "endsAt": _iso(ends) if ends else "0001-01-01T00:00:00Z",
    }
    return json.dumps(
        {
            "version": "4",
            "status": status,
            "receiver": "store",
            "groupKey": "{}:{}",
            "alerts": [alert],
        }
    ).encode()


def post(url: str, body: bytes, token: str = TOKEN) -> int:
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def steps(n: int) -> list[StepMessage]:
    """A small 4-rank job on node01/node02 (the report needs steps)."""
    out = []
    for step in range(n):
        recs = tuple(
            StepRecord(
                job_id=JOB,
                step=step,
                rank=r,
                world_size=4,
                local_rank=r % 2,
                host=f"node0{1 + r // 2}",
                start=T0 + step,
                end=T0 + step + 0.9,
                phases=Phases(data=0.05, forward=0.3, backward=0.4, optimizer=0.1, comm_wait=0.05),
            )
            for r in range(4)
        )
        out.append(
            StepMessage(
                host="node01", ts=T0 + step + 1, inst="sdk", seq=step, job_id=JOB, steps=recs
            )
        )
    return out


@pytest.fixture()
def loop(broker, tmp_path) -> Iterator[tuple[Settings, ChdbStore, Sink]]:
    settings = Settings.load(
        env={},
        bootstrap_servers=broker.bootstrap,
        topic_prefix="L",
        partitions=2,
        store_path=str(tmp_path / "chdb"),
    )
    ensure_topics(settings, sink_topics("L"))
    store = ChdbStore(settings.store_path)
    Migrator(store, raw_ttl_days=20000).migrate()
    sink = Sink(
        store,
        KafkaSource(settings, "it-loop"),
        sink_topics("L"),
        SinkConfig(batch_messages=100, batch_seconds=0.2),
    )
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        yield settings, store, sink
    finally:
        sink.stop()
        thread.join(15)
        store.close()


def wait_rows(sink: Sink, want: dict[str, int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = {t: sink.metrics.value("stepwatch_sink_rows_inserted_total", table=t) for t in want}
        if all(got[t] >= n for t, n in want.items()):
            return
        time.sleep(0.2)
    raise AssertionError(f"rows not stored in time: want {want}, got {got}")


def receiver(settings: Settings) -> tuple[AlertReceiver, KafkaPublisher]:
    publisher = KafkaPublisher(producer_config(settings), Topics(settings.topic_prefix).alerts)
    return AlertReceiver(publisher, TOKEN).start(), publisher


@pytest.mark.timeout(150)
def test_detection_alert_and_action_reach_the_store_timeline_and_report(loop, tmp_path):
    settings, store, sink = loop
    detection = DetectionMessage(
        host="node02",
        ts=T0 + 20,
        id="jobL-straggler-3",
        job_id=JOB,
        type="straggler",
        state="open",
        rank=3,
        step=20,
        first_step=15,
        cause="gpu",
        summary="rank 3 slow",
        inst="jobL-straggler-3",
        seq=0,
    )
    D.produce(settings.bootstrap_servers, "L", [*steps(60), detection])
    am, publisher = receiver(settings)
    try:
        assert post(f"{am.url}/alerts", webhook("firing", T0 + 25, None), "wrong") == 401
        assert post(f"{am.url}/alerts", b'{"version": "3"}') == 400
        assert post(f"{am.url}/alerts", webhook("firing", T0 + 25, None)) == 200
        assert post(f"{am.url}/alerts", webhook("firing", T0 + 25, None)) == 200  # repeat
        assert post(f"{am.url}/alerts", webhook("resolved", T0 + 25, T0 + 50)) == 200
    finally:
        am.stop()
        publisher.close()
    writer = KafkaWriter.from_settings(settings)
    decision = Decision(
        T0 + 30,
        "drain-node02-StragglerPersistent-abc",
        ActionKind.DRAIN,
        Outcome.ACTED,
        Mode.EXECUTE,
        "policy",
        "node02",
        JOB,
        "StragglerPersistent",
        "fp-node02-straggler",
        "gpu",
        "system",
        "scontrol update ok",
    )
    writer.write([decision.as_dict()])
    writer.close()
    wait_rows(sink, {"detections": 1, "alerts": 3, "remediation_actions": 1, "step_events": 240})

    alerts = store.query(
        "SELECT fingerprint, status, toFloat64(starts_at), toFloat64(ends_at), "
        "job_id, host, labels['cause'] FROM alerts FINAL ORDER BY status"
    ).rows
    assert alerts == [
        ("fp-node02-straggler", "firing", T0 + 25, None, JOB, "node02", "gpu"),
        ("fp-node02-straggler", "resolved", T0 + 25, T0 + 50, JOB, "node02", "gpu"),
    ]
    actions = store.query(
        "SELECT id, action, status, dry_run, host, alert_fingerprint, mode, actor "
        "FROM remediation_actions FINAL"
    ).rows
    assert actions == [
        (
            "drain-node02-StragglerPersistent-abc",
            "drain",
            "acted",
            False,
            "node02",
            "fp-node02-straggler",
            "execute",
            "stepwatch-remediator",
        )
    ]

    saved = queries.get("job_timeline")
    timeline = store.query(saved.sql, saved.bind({"job": JOB}, now=time.time())).dicts()
    kinds = [(r["source"], r["what"]) for r in timeline if r["source"] != "event"]
    assert kinds == [
        ("detection", "straggler:open"),
        ("alert", "StragglerPersistent:firing"),
        ("action", "drain:acted"),
        ("alert", "StragglerPersistent:resolved"),
    ]
    assert [r["ts"] for r in timeline] == sorted(r["ts"] for r in timeline)

    from stepwatch.report.build import build_report
    from stepwatch.report.data import load

    data = load(store, JOB)
    assert [a["status"] for a in data.alerts] == ["firing", "resolved"]
    assert [a["action"] for a in data.actions] == ["drain"]
    pytest.importorskip("matplotlib")
    html = build_report(store, JOB, tmp_path / "report").html.read_text()
    assert "StragglerPersistent" in html and "drain" in html
    alerts_section = html.split("<h2>Alerts</h2>")[1].split("<h2>")[0]
    actions_section = html.split("<h2>Remediation actions</h2>")[1].split("<h2>")[0]
    assert "none" not in alerts_section and "none" not in actions_section


def _am_alert(starts: float, ends: float) -> dict[str, Any]:
    return {
        "labels": {
            "alertname": "StragglerPersistent",
            "job_id": JOB,
            "host": "node02",
            "severity": "page",
            "class": "system",
            "remediation": "drain",
        },
        "annotations": {"summary": "straggler"},
        "startsAt": _iso(starts),
        "endsAt": _iso(ends),
    }


@pytest.mark.timeout(150)
def test_real_alertmanager_firing_then_resolved_reaches_the_alerts_table(
    loop, tmp_path, alertmanager_factory
):
    """The shipped routing with the store's receiver added: it records every alert and the
    tree below still delivers (the remediator hears of it too)."""
    settings, store, sink = loop
    am, publisher = receiver(settings)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    try:
        with WebhookReceiver() as hooks:
            config = alertmanager_config(
                Receivers(
                    hooks.url("/remediator"),
                    str(token),
                    hooks.url("/pager"),
                    hooks.url("/tickets"),
                    store_url=f"{am.url}/alerts",
                ),
                fast=True,
            )
            manager = alertmanager_factory(config)
            start = time.time() - 5
            manager.post_alerts([_am_alert(start, time.time() + 600)])
            wait_rows(sink, {"alerts": 1})
            manager.post_alerts([_am_alert(start, time.time() - 1)])  # Prometheus resolves it
            wait_rows(sink, {"alerts": 2})
            assert hooks.received("/remediator")  # the tree below the store route still runs
    finally:
        am.stop()
        publisher.close()
    rows = store.query(
        "SELECT status, alertname, job_id, host, fingerprint != '', "
        "ends_at IS NULL FROM alerts FINAL ORDER BY status"
    ).rows
    assert rows == [
        ("firing", "StragglerPersistent", JOB, "node02", True, True),
        ("resolved", "StragglerPersistent", JOB, "node02", True, False),
    ]
