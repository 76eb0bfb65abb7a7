"""The sink's own Prometheus metrics (a private registry, served on /metrics)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class SinkMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "stepwatch_sink_messages", "Kafka records consumed", ["topic"], registry=r
        )
        self.rows = Counter(
            "stepwatch_sink_rows_inserted", "Rows written to the store", ["table"], registry=r
        )
        self.batches = Counter(
            "stepwatch_sink_batches",
            "Partition batches written and committed",
            ["kind"],
            registry=r,
        )
        self.retries = Counter(
            "stepwatch_sink_insert_retries",
            "Inserts retried after a store error",
            ["table"],
            registry=r,
        )
        self.dead = Counter(
            "stepwatch_sink_dead_letter_rows",
            "Rows written to the dead-letter table",
            ["reason"],
            registry=r,
        )
        self.duplicates = Counter(
            "stepwatch_sink_duplicate_messages",
            "Messages dropped because their (host, inst, kind, seq) was already written",
            registry=r,
        )
        self.insert_seconds = Histogram(
            "stepwatch_sink_insert_seconds",
            "Time one insert took",
            ["table"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.lag = Gauge(
            "stepwatch_sink_consumer_lag_messages",
            "Records in Kafka not yet committed by the sink",
            ["topic", "partition"],
            registry=r,
        )
        self.buffered = Gauge(
            "stepwatch_sink_buffered_messages", "Records consumed but not yet written", registry=r
        )
        self.last_commit = Gauge(
            "stepwatch_sink_last_commit_timestamp_seconds",
            "When the sink last committed offsets",
            registry=r,
        )
        self.ready = Gauge(
            "stepwatch_sink_ready",
            "1 once the schema is migrated and the consumer subscribed",
            registry=r,
        )

    def value(self, name: str, **labels: Any) -> float:
        """A sample's current value (0 when absent), for tests and logs."""
        got = self.registry.get_sample_value(name, labels or None)
        return float(got or 0.0)
