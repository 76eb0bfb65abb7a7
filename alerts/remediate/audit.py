"""Where decisions go: a Prometheus metric, a Kafka topic and the ClickHouse store.

Writers run on one background thread behind a bounded queue: a slow or absent
Kafka or store never blocks a decision (a full queue drops the record, counted
in ``stepwatch_remediator_audit_dropped_total`` and logged once per writer).

The store path (documented choice): rows go straight into
``remediation_actions`` through ClickHouse's HTTP interface (``INSERT ...
FORMAT JSONEachRow``): a ClickHouse server in production, the embedded store's
endpoint (``stepwatch db serve --allow-writes``) on one machine. The Kafka
topic ``<prefix>.remediations`` carries the same records for anyone else.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from stepwatch.alerts.remediate.model import Decision, Outcome
from stepwatch.errors import RemediationError

log = logging.getLogger(__name__)

ACTOR = "stepwatch-remediator"
_QUEUE = 10000


class AuditSink(Protocol):
    def record(self, decision: Decision) -> None: ...

    def actuator_error(self, actuator: str, transient: bool) -> None: ...

    def breaker(self, is_open: bool) -> None: ...


class Writer(Protocol):
    name: str

    def write(self, records: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter("stepwatch_remediator_decisions_total",
                                 "Remediator decisions by action and outcome",
                                 ["action", "outcome"], registry=registry)
        self.breaker = Gauge("stepwatch_remediator_circuit_breaker_open",
                             "1 while the circuit breaker is open (a person must close it)",
                             registry=registry)
        self.actuator_errors = Counter("stepwatch_remediator_actuator_errors_total",
                                       "Failed actuator calls", ["actuator", "kind"], registry=registry)
        self.dropped = Counter("stepwatch_remediator_audit_dropped_total",
                               "Audit records not written (queue full or writer failing)",
                               ["writer"], registry=registry)
        self.rejected = Counter("stepwatch_remediator_requests_rejected_total",
                                "Webhook/API requests refused", ["code"], registry=registry)


class Audit:
    """The :class:`AuditSink` of the service: metric now, writers in the background."""

    def __init__(self, metrics: Metrics, writers: Sequence[Writer] = ()) -> None:
        self.metrics = metrics
        self.writers = list(writers)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(_QUEUE)
        self._thread = threading.Thread(target=self._run, name="remediator-audit", daemon=True)
        self._failing: set[str] = set()
        if self.writers:
            self._thread.start()

    def record(self, decision: Decision) -> None:
        self.metrics.decisions.labels(decision.action.value, decision.outcome.value).inc()
        if not self.writers:
            return
        try:
            self._queue.put_nowait(decision.as_dict())
        except queue.Full:
            for w in self.writers:
                self.metrics.dropped.labels(w.name).inc()

    def actuator_error(self, actuator: str, transient: bool) -> None:
        self.metrics.actuator_errors.labels(actuator, "transient" if transient else "permanent").inc()

    def breaker(self, is_open: bool) -> None:
        self.metrics.breaker.set(1 if is_open else 0)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < 500:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._write(batch)
                    return
                batch.append(nxt)
            self._write(batch)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        for writer in self.writers:
            try:
                writer.write(batch)
                self._failing.discard(writer.name)
            except Exception as err:  # a writer never stops the remediator
                self.metrics.dropped.labels(writer.name).inc(len(batch))
                if writer.name not in self._failing:
                    log.error("audit writer failing writer=%s error=%s", writer.name, err)
                    self._failing.add(writer.name)

    def close(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
        for writer in self.writers:
            writer.close()


class KafkaWriter:
    """Each decision as JSON on ``<prefix>.remediations``, keyed by action id."""

    name = "kafka"

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self._producer: Any = Producer(config)

    def write(self, records: list[dict[str, Any]]) -> None:
        if self._producer is None:
            raise RemediationError("the Kafka audit writer is closed")
        for rec in records:
            self._producer.produce(self.topic, json.dumps(rec).encode(), key=str(rec["id"]).encode())
        left = self._producer.flush(10)
        if left:
            raise RemediationError(f"{left} audit record(s) not delivered to {self.topic}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None  # librdkafka's threads end with the object


def store_row(rec: dict[str, Any]) -> dict[str, Any]:
    """A decision as a ``remediation_actions`` row (schema 0004 + 0006)."""
    return {
        "ts": round(float(rec["ts"]), 3), "id": rec["id"], "action": rec["action"],
        "status": rec["outcome"], "dry_run": rec["outcome"] == Outcome.DRY_RUN.value,
        "job_id": rec["job_id"], "host": rec["host"], "detection_id": "",
        "alert_fingerprint": rec["fingerprint"], "reason": rec["reason"], "detail": rec["detail"],
        "actor": ACTOR, "mode": rec["mode"], "alertname": rec["alertname"], "cause": rec["cause"],
        "alert_class": rec["class"],
    }


class ClickHouseWriter:
    """``INSERT INTO remediation_actions FORMAT JSONEachRow`` over ClickHouse's HTTP interface."""

    name = "clickhouse"

    def __init__(self, url: str, user: str = "default", password: str = "",
                 database: str = "stepwatch", timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.database = database
        self.timeout = timeout
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"

    def write(self, records: list[dict[str, Any]]) -> None:
        body = "\n".join(json.dumps(store_row(r)) for r in records).encode()
        query = urllib.parse.urlencode({
            "query": "INSERT INTO remediation_actions SETTINGS date_time_input_format='best_effort' "
                     "FORMAT JSONEachRow", "database": self.database})
        req = urllib.request.Request(f"{self.url}/?{query}", data=body, method="POST",
                                     headers={"Authorization": self._auth})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")[:300]
            raise RemediationError(f"store refused the audit rows: HTTP {err.code} {text}") from err
        except (urllib.error.URLError, OSError) as err:
            raise RemediationError(f"store unreachable at {self.url}: {err}") from err

    def close(self) -> None:
        pass
