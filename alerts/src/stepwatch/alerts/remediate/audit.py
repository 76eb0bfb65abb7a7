"""Where decisions go: a Prometheus metric, a Kafka topic and the ClickHouse store.

Writers run on one background thread behind a bounded queue: a slow or absent
Kafka or store never blocks a decision (a full queue drops the record, counted
in ``stepwatch_remediator_audit_dropped_total`` and logged once per writer).

The store path: every decision is published on the contract's topic
``<prefix>.remediations`` (:class:`KafkaWriter`); the store's sink consumes it
into ``remediation_actions`` (``stepwatch db sink``), so the sink stays the
store's single writer and the same records reach anyone else who reads the
topic. There is no second, hand-written insert path.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from stepwatch.alerts.remediate.model import Decision
from stepwatch.contract.ops import RemediationRecord, encode_ops
from stepwatch.contract.topics import Topics
from stepwatch.errors import RemediationError
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

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
        self.decisions = Counter(
            "stepwatch_remediator_decisions_total",
            "Remediator decisions by action and outcome",
            ["action", "outcome"],
            registry=registry,
        )
        self.breaker = Gauge(
            "stepwatch_remediator_circuit_breaker_open",
            "1 while the circuit breaker is open (a person must close it)",
            registry=registry,
        )
        self.actuator_errors = Counter(
            "stepwatch_remediator_actuator_errors_total",
            "Failed actuator calls",
            ["actuator", "kind"],
            registry=registry,
        )
        self.dropped = Counter(
            "stepwatch_remediator_audit_dropped_total",
            "Audit records not written (queue full or writer failing)",
            ["writer"],
            registry=registry,
        )
        self.rejected = Counter(
            "stepwatch_remediator_requests_rejected_total",
            "Webhook/API requests refused",
            ["code"],
            registry=registry,
        )


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
        self.metrics.actuator_errors.labels(
            actuator, "transient" if transient else "permanent"
        ).inc()

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
    """Each decision as a :class:`~stepwatch.contract.ops.RemediationRecord` on
    ``<prefix>.remediations`` (the contract's topic name), keyed by action id.

    The store's sink consumes that topic into ``remediation_actions``: it stays
    the store's only writer.
    """

    name = "kafka"

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self._producer: Any = Producer(config)

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaWriter:
        """The project's producer configuration and the contract's topic name."""
        from stepwatch.kafka import producer_config

        return cls(
            producer_config(settings, **{"linger.ms": 5}),
            Topics(settings.topic_prefix).remediations,
        )

    def write(self, records: list[dict[str, Any]]) -> None:
        if self._producer is None:
            raise RemediationError("the Kafka audit writer is closed")
        for rec in records:
            value = encode_ops(msgspec.convert(rec, RemediationRecord, from_attributes=False))
            self._producer.produce(self.topic, value, key=str(rec["id"]).encode())
        left = self._producer.flush(10)
        if left:
            raise RemediationError(f"{left} audit record(s) not delivered to {self.topic}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None  # librdkafka's threads end with the object
