"""The alert receiver: Alertmanager webhooks -> ``<prefix>.alerts`` -> the store.

A small HTTP service Alertmanager posts to (webhook payload version 4, with
``Authorization: Bearer <token>`` like the remediator). Every alert of a
notification, firing or resolved, becomes one
:class:`~stepwatch.contract.ops.AlertRecord` on the contract's topic
``<prefix>.alerts``, keyed by its fingerprint. The store's sink consumes the
topic into the ``alerts`` table: the sink stays the store's only writer.

- ``POST /alerts`` (or ``/``): the webhook. 200 once Kafka acknowledged every
  record; 503 when it did not (Alertmanager retries); 400 bad payload; 401
  missing or wrong token; 413 body over ``max_body``.
- ``GET /healthz``: 200.

Alertmanager re-sends a firing alert every ``repeat_interval``: the record is
the same (fingerprint, starts_at, status) and the table collapses repeats.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from stepwatch.contract.ops import AlertRecord, encode_ops
from stepwatch.contract.records import plain_name, plain_text
from stepwatch.contract.topics import Topics
from stepwatch.errors import ConfigError, RemediationError, StepwatchError
from stepwatch.httpd import DeadlineHandler, TokenHTTPService, body_refusal
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
MAX_ALERTS = 1000
_NEVER = 1.0  # Alertmanager's zero time (0001-01-01) and anything before 1970: no end yet

Publish = Callable[[list[AlertRecord]], None]


class PayloadError(RemediationError):
    """Not a valid Alertmanager webhook payload (version 4): the receiver answers 400."""


def _epoch(text: Any) -> float | None:
    """RFC 3339 (Alertmanager's Go time, nanoseconds allowed) -> epoch seconds; None: unset."""
    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    head, _, frac = text.partition(".")
    zone = ""
    if frac:
        digits = "".join(c for c in frac if c.isdigit())
        zone = frac[len(digits) :]
        frac = digits[:6]
    else:
        head, zone = text[:19], text[19:]
    try:
        stamp = datetime.fromisoformat(
            head + (f".{frac}" if frac else "") + zone.replace("Z", "+00:00")
        )
    except ValueError as err:
        raise PayloadError(f"not an RFC 3339 time: {text!r}") from err
    value = stamp.timestamp()
    return value if value > _NEVER else None


def _strings(where: str, value: Any, plain: Callable[[str], str]) -> dict[str, str]:
    """A map of strings, its keys made plain names and its values ``plain`` (a label a
    sender chose reaches the store, logs and terminals: no control character in it)."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError(f"{where} is not a map of strings")
    return {plain_name(k): plain(v) for k, v in value.items()}


def records(body: bytes, received_at: float) -> list[AlertRecord]:
    """The alerts of one webhook body, as records (PayloadError when it is not v4)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting
        raise PayloadError(f"not JSON: {err}") from err
    if not isinstance(data, dict) or str(data.get("version")) != "4":
        raise PayloadError("not an Alertmanager webhook payload of version 4")
    alerts = data.get("alerts")
    if not isinstance(alerts, list) or len(alerts) > MAX_ALERTS:
        raise PayloadError(f"'alerts' must be a list of at most {MAX_ALERTS}")
    return [_record(i, a, received_at) for i, a in enumerate(alerts)]


def _record(index: int, raw: Any, received_at: float) -> AlertRecord:
    where = f"alerts[{index}]"
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("fingerprint"), str)
        or not raw["fingerprint"]
    ):
        raise PayloadError(f"{where} is not an alert with a fingerprint")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"{where}.status must be firing or resolved")
    labels = _strings(f"{where}.labels", raw.get("labels"), plain_name)
    starts = _epoch(raw.get("startsAt"))
    ends = _epoch(raw.get("endsAt"))
    return AlertRecord(
        received_at=received_at,
        fingerprint=plain_name(raw["fingerprint"]),
        status=status,
        alertname=labels.get("alertname", ""),
        starts_at=received_at if starts is None else starts,
        ends_at=ends if status == "resolved" else None,
        severity=labels.get("severity", ""),
        job_id=labels.get("job_id", ""),
        host=labels.get("host", ""),
        labels=labels,
        annotations=_strings(f"{where}.annotations", raw.get("annotations") or {}, plain_text),
    )


class KafkaPublisher:
    """Publishes alert records on ``topic`` with the project's producer settings."""

    def __init__(self, config: dict[str, Any], topic: str, timeout: float = 10.0) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.timeout = timeout
        self._producer: Any = Producer(config)
        self._lock = threading.Lock()

    def __call__(self, batch: list[AlertRecord]) -> None:
        with self._lock:
            for rec in batch:
                self._producer.produce(self.topic, encode_ops(rec), key=rec.fingerprint.encode())
            left = self._producer.flush(self.timeout)
        if left:
            raise RemediationError(f"{left} alert record(s) not delivered to {self.topic}")

    def close(self) -> None:
        self._producer.flush(5)


class AlertReceiver(TokenHTTPService):
    """The HTTP server; ``publish`` gets each webhook's records (raise: answer 503)."""

    name = "alert receiver"

    def __init__(
        self,
        publish: Publish,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = MAX_BODY,
    ) -> None:
        self.publish = publish
        self.max_body = max_body
        self.received = 0
        super().__init__(token, _handler(self), host, port)

    def start(self) -> AlertReceiver:
        super().start()
        log.info("alert receiver ready url=%s/alerts", self.url)
        return self

    def stop(self) -> None:
        super().stop()
        log.info("alert receiver stopped alerts=%d", self.received)

    def handle(self, body: bytes) -> tuple[int, str]:
        try:
            batch = records(body, time.time())
        except PayloadError as err:
            return 400, str(err)
        try:
            self.publish(batch)
        except StepwatchError as err:
            log.error("alert records not published alerts=%d error=%s", len(batch), err)
            return 503, "alerts not recorded, retry"
        self.received += len(batch)
        log.info(
            "alerts recorded alerts=%d firing=%d",
            len(batch),
            sum(r.status == "firing" for r in batch),
        )
        return 200, f"{len(batch)} alert(s) recorded"


def _handler(receiver: AlertReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(DeadlineHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("alert receiver " + format, *args)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/healthz":
                self._reply(200, "ok")
            else:
                self._reply(404, "not found")

        def do_POST(self) -> None:
            # a refusal before the body is read closes the connection: left unread, the
            # body was parsed as a request of its own (a 401, then the smuggled one's 200)
            if self.path.split("?")[0].rstrip("/") not in ("", "/alerts"):
                self.close_connection = True
                self._reply(404, "not found")
                return
            if not receiver.authorized(self.headers.get("Authorization", "")):
                self.close_connection = True
                self._reply(401, "missing or wrong bearer token")
                return
            refused = body_refusal(self.headers, receiver.max_body)
            if refused is not None:
                self.close_connection = True
                self._reply(*refused)
                return
            size = int(self.headers.get("Content-Length") or 0)
            self._reply(*receiver.handle(self.rfile.read(size)))

        def _reply(self, status: int, text: str) -> None:
            body = (json.dumps({"status": status, "message": text}) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def build(settings: Settings, port: int | None = None) -> tuple[AlertReceiver, KafkaPublisher]:
    """Receiver + publisher from settings: the remediator's token and bind address, the
    project's producer configuration, the contract's topic (created when missing)."""
    from stepwatch.alerts.remediate.service import read_token
    from stepwatch.kafka import ensure_topics, producer_config

    if not settings.bootstrap_servers:
        raise ConfigError(
            "the alert receiver needs --bootstrap-servers (or STEPWATCH_BOOTSTRAP_SERVERS)"
        )
    topic = Topics(settings.topic_prefix).alerts
    ensure_topics(settings, [topic])
    publisher = KafkaPublisher(producer_config(settings, **{"linger.ms": 5}), topic)
    port = settings.remediate_alerts_port if port is None else port
    return AlertReceiver(publisher, read_token(settings), settings.remediate_bind, port), publisher
