"""The alert receiver's webhook parsing (Alertmanager payload v4 -> AlertRecord)."""

from __future__ import annotations

import json

import pytest

from stepwatch.alerts.receiver import AlertReceiver, PayloadError, records
from stepwatch.contract.ops import AlertRecord, decode_alert, encode_ops
from stepwatch.errors import TransportError

pytestmark = pytest.mark.unit


def body(**alert: object) -> bytes:
    base = {
        "status": "firing",
        "fingerprint": "f1",
        "labels": {"alertname": "A", "job_id": "7", "host": "node02", "severity": "page"},
        "annotations": {},
        "startsAt": "2026-01-01T00:00:00.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
    }
    return json.dumps({"version": "4", "alerts": [{**base, **alert}]}).encode()


def test_firing_and_resolved_alerts_become_records() -> None:
    [firing] = records(body(), received_at=5.0)
    assert firing.starts_at == pytest.approx(1767225600.123457, abs=1e-6)
    assert firing.ends_at is None and firing.job_id == "7" and firing.severity == "page"
    [resolved] = records(body(status="resolved", endsAt="2026-01-01T01:00:00+01:00"), 5.0)
    assert resolved.ends_at == pytest.approx(1767225600.0, abs=1e-6)
    assert decode_alert(encode_ops(resolved)) == resolved


@pytest.mark.parametrize(
    "bad",
    [
        b"{",
        b'{"version": "3", "alerts": []}',
        body(status="pending"),
        body(fingerprint=""),
        body(labels={"a": 1}),
        body(startsAt="yesterday"),
    ],
)
def test_bad_payloads_are_refused(bad: bytes) -> None:
    with pytest.raises(PayloadError):
        records(bad, 0.0)


def test_a_failed_publish_answers_503_so_alertmanager_retries() -> None:
    sent: list[AlertRecord] = []

    def down(batch: list[AlertRecord]) -> None:
        raise TransportError("broker down")

    receiver = AlertReceiver(sent.extend, "t")
    assert receiver.handle(body())[0] == 200 and len(sent) == 1
    assert receiver.handle(b"{}")[0] == 400
    failing = AlertReceiver(down, "t")
    assert failing.handle(body())[0] == 503
    assert receiver.authorized("Bearer t") and not receiver.authorized("Bearer x")
    receiver.httpd.server_close()
    failing.httpd.server_close()


def test_labels_a_sender_chose_are_made_plain_names() -> None:
    """Before, an alert's labels were stored as sent: an ANSI escape, a forged log line,
    a bidi override, a 200,000-character host reached the alerts table and a terminal."""
    body = {
        "version": "4",
        "alerts": [
            {
                "fingerprint": "f\x1b]0;owned\x07",
                "status": "firing",
                "labels": {
                    "alertname": "StragglerPersistent",
                    "job_id": '42\x1b[2J\nlevel=INFO msg="remediation executed"',
                    "host": "h" * 200_000,
                    "x\u202e": "y",
                },
                "annotations": {"summary": "a\r\nb\x1b[31m"},
            }
        ],
    }
    (rec,) = records(json.dumps(body).encode(), 1.0)
    assert rec.job_id == '42\ufffd[2J\ufffdlevel=INFO msg="remediation executed"'
    assert len(rec.host) == 256 and rec.fingerprint == "f\ufffd]0;owned\ufffd"
    assert "x\ufffd" in rec.labels and rec.annotations["summary"] == "a\nb\ufffd[31m"
    assert decode_alert(encode_ops(rec)) == rec  # what the sink then reads back


def test_the_sink_refuses_an_alert_record_that_breaks_the_name_rule() -> None:
    """A record written to the alerts topic by someone else than the receiver."""
    from stepwatch.errors import ContractError

    forged = AlertRecord(1.0, "f", "firing", "A\x1b[2J", 1.0, host="h")
    with pytest.raises(ContractError, match="schema"):
        decode_alert(encode_ops(forged))
