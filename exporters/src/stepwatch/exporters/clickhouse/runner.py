"""The sink as a service: topics, store, migrations, endpoint, /metrics, signals.

``stepwatch db sink`` calls :func:`run_sink`; so do the reliability tests (with
an ``after_insert`` hook that kills the process between insert and commit).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from stepwatch.errors import ConfigError, StoreLockedError
from stepwatch.exporters.clickhouse.engine_memory import EngineMemoryCollector, release
from stepwatch.exporters.clickhouse.planner import Batch
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.exporters.clickhouse.sink_metrics import SinkMetrics
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


def run_sink(
    settings: Settings,
    config: SinkConfig = SinkConfig(),
    *,
    serve: bool = True,
    after_insert: Callable[[list[Batch]], None] | None = None,
    install_signals: bool = True,
    listen: str = "",
) -> SinkMetrics:
    """Run until SIGTERM/SIGINT; return the metrics (for callers that want totals)."""
    from stepwatch.exporters.clickhouse.access import open_writer
    from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
    from stepwatch.exporters.clickhouse.migrations import Migrator
    from stepwatch.kafka import ensure_topics

    if not settings.bootstrap_servers:
        raise ConfigError("the sink needs --bootstrap-servers (or STEPWATCH_BOOTSTRAP_SERVERS)")
    topics = sink_topics(settings.topic_prefix)
    ensure_topics(settings, topics)
    config = dataclasses.replace(config, max_message_bytes=settings.max_message_bytes)
    store = _open_owned(settings, open_writer)
    metrics = SinkMetrics()
    service: Any = None
    http: Any = None
    try:
        Migrator(store, settings.store_raw_ttl_days, cluster=settings.clickhouse_cluster).migrate()
        if store.backend == "chdb" and serve:
            service = serve_store(settings)
        if settings.sink_metrics_port or listen:
            from stepwatch.metrics_http import Endpoint, serve_metrics

            endpoint = Endpoint.from_settings(settings, settings.sink_metrics_port, listen)
            http = serve_metrics(metrics.registry, endpoint, name="sink")
        embedded = store.backend == "chdb"  # the engine is in this process
        sink = Sink(
            store,
            KafkaSource(settings, config.group_id),
            topics,
            config,
            metrics,
            after_insert=after_insert,
            release=(lambda: release(store)) if embedded else None,
        )
        if embedded:  # say where the process's memory is
            metrics.registry.register(
                EngineMemoryCollector(
                    store, extra=lambda: {"dedup_senders": float(len(sink.preparer.senders))}
                )
            )
        if install_signals:
            on_signals(sink.stop)
        sink.run()
    finally:
        if http is not None:
            http.shutdown()
        if service is not None:
            service.stop()
        store.close()
    return metrics


def _open_owned(
    settings: Settings, open_writer: Callable[[Settings], Any], wait: float = 30.0
) -> Any:
    """Open the store to write; a reader holding the embedded path briefly is waited for."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return open_writer(settings)
        except StoreLockedError as err:
            if time.monotonic() > deadline:
                raise
            log.warning("store busy, retrying path=%s error=%s", settings.store_path, err)
            time.sleep(0.5)


def serve_store(settings: Settings, port: int = 0, allow_writes: bool = False) -> Any:
    """Start the query endpoint of the embedded store this process owns."""
    from stepwatch.exporters.clickhouse.service import QueryService, endpoint_path

    return QueryService(
        settings.store_path,
        settings.clickhouse_database,
        port=port,
        allow_writes=allow_writes,
        endpoint_file=endpoint_path(settings.store_path),
        max_body_bytes=settings.store_endpoint_max_body_bytes,
        max_decompressed_bytes=settings.store_endpoint_max_decompressed_bytes,
        max_execution_time=settings.store_endpoint_max_query_seconds,
        max_result_bytes=settings.store_endpoint_max_result_bytes,
        max_memory_usage=settings.store_endpoint_max_memory_bytes,
        max_concurrent_queries=settings.store_endpoint_max_concurrent_queries,
        max_total_memory=settings.store_endpoint_max_total_memory_bytes,
        queue_seconds=settings.store_endpoint_queue_seconds,
    ).start()


def on_signals(stop: Callable[[], Any]) -> None:
    """SIGTERM and SIGINT call ``stop`` (the loop then flushes, commits and closes)."""

    def handler(signum: int, frame: Any) -> None:
        log.info("signal received signal=%s: stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
