"""librdkafka's log lines go through the project's logging, rate-limited per facility."""

from __future__ import annotations

import logging
import time

import pytest

from stepwatch.kafka import client_config, kafka_logger
from stepwatch.logs import RateLimit
from stepwatch.settings import Settings


def _record(name: str, fac: str, text: str = "x") -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, "%s [%s] %s", (fac, "rk", text), None)


def test_rate_limit_lets_one_line_per_facility_and_interval_and_counts_the_rest() -> None:
    now = [0.0]
    limit = RateLimit(interval=60.0, clock=lambda: now[0])
    fails = [limit.filter(_record("c", "FAIL")) for _ in range(500)]
    assert fails.count(True) == 1
    assert limit.filter(_record("c", "REQTMOUT"))  # another facility has its own budget
    now[0] = 61.0
    again = _record("c", "FAIL")
    assert limit.filter(again)
    assert "suppressed=499" in again.getMessage()


@pytest.mark.timeout(60)
def test_an_unreachable_broker_prints_no_raw_client_lines(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka import Consumer

    caplog.set_level(logging.DEBUG, logger="stepwatch.kafka.client")
    settings = Settings.load(
        env={},
        bootstrap_servers="127.0.0.1:1",
        kafka_config={"reconnect.backoff.ms": "10", "reconnect.backoff.max.ms": "20"},
    )
    consumer = Consumer(client_config(settings, {"group.id": "g"}, role="test"))
    consumer.subscribe(["t.steps"])
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        consumer.poll(0.1)  # librdkafka's log lines are served from poll
    consumer.close()
    raw = [line for line in capfd.readouterr().err.splitlines() if line.startswith("%")]
    assert raw == []  # nothing in librdkafka's own format on stderr
    routed = [r for r in caplog.records if r.name == "stepwatch.kafka.client.test"]
    assert routed  # the lines reach the project's logging ...
    per_facility: dict[str, int] = {}
    for r in routed:
        key = str(r.args[0]) if isinstance(r.args, tuple) and r.args else r.msg
        per_facility[key] = per_facility.get(key, 0) + 1
    assert max(per_facility.values()) == 1  # ... once per facility and minute
    assert kafka_logger("test") is kafka_logger("test")
