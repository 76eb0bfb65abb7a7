"""The agent's Prometheus metrics, read from its state at scrape time.

Its own health (``stepwatch_agent_*``) and its host's GPUs and RDMA ports
(``stepwatch_gpu_*``, ``stepwatch_infiniband_*``, ``stepwatch_roce_*``; see
:mod:`stepwatch.agents.host_series`).

A custom collector on a private :class:`~prometheus_client.CollectorRegistry`
turns an :class:`~stepwatch.agents.agent.AgentSnapshot` into metric families, so the
tick loop pays nothing for metrics. Served over HTTP on
``Settings.metrics_port`` (0 disables it) on ``Settings.metrics_host``
(loopback by default), with optional TLS and basic auth
(:mod:`stepwatch.metrics_http`). Process CPU and memory come from
prometheus-client's own process collector (``process_*``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stepwatch.agents.agent import AgentSnapshot
from stepwatch.agents.collectors.base import HealthState
from stepwatch.agents.host_series import families as host_families
from stepwatch.metrics_http import Endpoint, serve_metrics

log = logging.getLogger(__name__)

P = "stepwatch_agent_"


class AgentCollector:
    """Exposes one agent's snapshot (see ``docs/agent.md`` for every metric)."""

    def __init__(self, snapshot: Callable[[], AgentSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield _gauge("up", "1 while the agent process runs.", 1)
        yield _gauge(
            "ready", "1 once the agent loop runs (0 while starting or stopping).", int(s.ready)
        )
        info = GaugeMetricFamily(P + "info", "The agent instance.", labels=["host", "inst"])
        info.add_metric([s.host, s.inst], 1)
        yield info
        yield _counter("ticks", "Ticks run.", s.ticks)
        yield _counter("tick_overruns", "Ticks skipped because a tick ran late.", s.overruns)
        yield _gauge(
            "last_tick_duration_seconds", "Wall time of the last tick.", s.last_tick_seconds
        )
        yield from _collectors(s)
        yield _labelled(
            CounterMetricFamily, "messages", "Messages handed to the publisher.", "kind", s.messages
        )
        yield _counter("sink_errors", "Ticks whose messages the publisher refused.", s.sink_errors)
        yield _labelled(
            CounterMetricFamily,
            "values_left_out",
            "Readings' values beyond the contract, left out (the rest sent), by field.",
            "field",
            s.values_left_out,
        )
        yield _counter("steps_received", "Step records received from ranks.", s.steps_received)
        yield _labelled(
            CounterMetricFamily,
            "datagrams_rejected",
            "Datagrams from ranks rejected, by reason.",
            "reason",
            s.datagrams_rejected,
        )
        yield _gauge(
            "rank_processes_watched",
            "Rank processes watched for an end without job_end (pidfds held).",
            s.rank_processes_watched,
        )
        yield _counter(
            "rank_exits",
            "rank_exit events: rank processes that ended without job_end.",
            s.rank_exits,
        )
        yield _counter(
            "rank_watch_skipped",
            "Rank processes not watched: over the exit watch's bounds.",
            s.rank_watch_skipped,
        )
        yield _gauge(
            "rank_exit_events_listening",
            "1 when the kernel's process events tell how rank processes ended (CN_PROC; "
            "0: read from /proc before the parent reaps them, when it does not first).",
            float(s.exit_events_listening),
        )
        if s.sink is not None:
            yield from _publisher(s.sink)
        yield from host_families(s.host, s.series)


def _collectors(s: AgentSnapshot) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        P + "collector_state",
        "1 for the collector's current health state.",
        labels=["collector", "state"],
    )
    errors = CounterMetricFamily(
        P + "collector_errors",
        "Collector errors (failed reads and exceptions caught).",
        labels=["collector"],
    )
    for name, health in s.health.items():
        for value in HealthState:
            state.add_metric([name, value.value], int(health.state is value))
        errors.add_metric([name], health.errors_total + s.collector_errors.get(name, 0))
    yield state
    yield errors


def _publisher(p: Any) -> Iterator[Metric]:
    yield _gauge(
        "broker_up",
        "1 when Kafka accepts records (0: spooling to disk).",
        int(p.state.value == "up"),
    )
    yield _gauge(
        "kafka_ready",
        "1 when the publisher reaches Kafka and produces (0: it cannot "
        "reach it, e.g. from the start with a bad setting; records are spooled).",
        int(p.state.value == "up"),
    )
    yield _gauge(
        "kafka_last_success_timestamp_seconds",
        "When Kafka last confirmed a delivery (Unix time; 0: never).",
        p.last_success,
    )
    yield _labelled(
        CounterMetricFamily,
        "messages_produced",
        "Messages confirmed by Kafka, by kind.",
        "kind",
        p.produced,
    )
    yield _labelled(
        CounterMetricFamily,
        "delivery_failures",
        "Delivery reports with an error, by reason (records are retried).",
        "reason",
        p.delivery_failures,
    )
    yield _labelled(
        CounterMetricFamily,
        "dead_letters",
        "Records Kafka refused for good (too_large, invalid...), kept in "
        "<spool_dir>/dead and never retried, by reason.",
        "reason",
        {"too_large": 0, **getattr(p, "dead_letters", {})},
    )
    yield _counter(
        "batch_splits",
        "Times the produce batch size was halved after Kafka refused a batch as too large.",
        getattr(p, "batch_splits", 0),
    )
    yield _counter("producer_resets", "Producers replaced after an outage.", p.producer_resets)
    yield _counter("spool_rewinds", "Rewinds to the first unacknowledged record.", p.rewinds)
    spool = p.spool
    yield _gauge("spool_records", "Records in the spool not yet confirmed by Kafka.", spool.records)
    yield _gauge("spool_bytes", "Bytes in the spool not yet confirmed by Kafka.", spool.bytes)
    yield _gauge("spool_max_bytes", "The spool's bound.", spool.max_bytes)
    yield _labelled(
        CounterMetricFamily,
        "spool_dropped_records",
        "Records dropped without delivery, by reason (bound: the spool was full "
        "and its oldest unsent data was dropped).",
        "reason",
        {"bound": 0, **spool.dropped},
    )
    yield _counter(
        "spool_torn_frames",
        "Torn frames truncated at start (a crash mid-write).",
        spool.torn_frames,
    )


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(P + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(P + name, doc, value=value)


def _labelled(
    family: type[CounterMetricFamily | GaugeMetricFamily],
    name: str,
    doc: str,
    label: str,
    values: dict[str, int],
) -> Metric:
    metric = family(P + name, doc, labels=[label])
    for key, value in sorted(values.items()):
        metric.add_metric([key], value)
    return metric


def registry_for(
    snapshot: Callable[[], AgentSnapshot], *, process: bool = True
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(snapshot))
    if process:
        ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def serve(registry: CollectorRegistry, endpoint: Endpoint | int, addr: str = "127.0.0.1") -> Any:
    """Serve /metrics (listen address, TLS, basic auth: :mod:`stepwatch.metrics_http`).

    A bare port (and ``addr``) means plain HTTP without auth; the server has
    ``server_port`` and ``shutdown()``.
    """
    if isinstance(endpoint, int):
        endpoint = Endpoint(host=addr, port=endpoint)
    return serve_metrics(registry, endpoint, name="agent")
