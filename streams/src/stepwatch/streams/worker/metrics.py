"""Prometheus metrics of a stream worker: its jobs' health and its own.

Each worker owns a :class:`CollectorRegistry` (no global state) served on
``Settings.stream_metrics_port``. Cardinality is bounded by design:

* per job (``job_id``): step time and its straggler-free baseline, throughput,
  MFU, goodput, badput by ``reason`` (definitions: :mod:`stepwatch.contract.goodput`),
  hang, open detections by ``type`` — only jobs of the partitions this worker owns now;
* per flagged rank (``job_id, rank, host, gpu, type, cause``): the score, only
  while the detection is open — the series disappears when it resolves;
* per open detection (``stepwatch_detection_score``): type, cause, fault class
  and where it points (rank, host, GPU, NIC ``device``/``port``) — what the
  alert rules and the remediator route on; bounded by the open detections;
* pipeline health: by ``kind`` (4 input kinds), ``reason`` (closed sets),
  ``partition`` (the partition count).

Job and rank series are rendered at scrape time from an immutable snapshot the
worker swaps in once per tick, so stale series cannot linger and the HTTP
thread never reads state the event loop is changing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stepwatch.contract import DetectionMessage
from stepwatch.contract.goodput import MFU_UNKNOWN, Badput
from stepwatch.metrics_http import Endpoint, serve_metrics
from stepwatch.streams.core.api import JobStats

log = logging.getLogger(__name__)

NS = "stepwatch"
RANK_LABELS = ("job_id", "rank", "host", "gpu", "type", "cause")
DETECTION_LABELS = (
    "job_id",
    "type",
    "cause",
    "fault",
    "rank",
    "host",
    "gpu",
    "group",
    "device",
    "port",
)


@dataclass(frozen=True)
class Snapshot:
    """What the job collector renders: one tuple swap per tick."""

    jobs: tuple[JobStats, ...] = ()
    open: tuple[DetectionMessage, ...] = ()
    scores: Mapping[tuple[str, int], float] = field(default_factory=dict)


class JobCollector:
    """Per-job and per-flagged-rank gauges from the latest snapshot."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        yield from _job_families(snap.jobs)
        yield from _detection_families(snap)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{NS}_{name}", doc, labels=labels)


def _job_families(jobs: tuple[JobStats, ...]) -> Iterator[Metric]:
    spec: list[tuple[str, str, str]] = [
        (
            "job_step_seconds",
            "Step time: median wall time of the job's recent steps (each step: "
            "the median over its ranks; waiting for a straggler included).",
            "step_seconds_median",
        ),
        (
            "job_step_baseline_seconds",
            "Straggler-free baseline step time: the job's own step time "
            "over the steps no slowdown was flagged in (the detector's baseline).",
            "step_seconds_baseline",
        ),
        (
            "job_samples_per_second",
            "Training samples per second (all ranks).",
            "samples_per_second",
        ),
        ("job_tokens_per_second", "Tokens per second (all ranks).", "tokens_per_second"),
        (
            "job_mfu_ratio",
            "Model FLOPs utilisation (0..1); absent unless the steps carry flops "
            "and the GPUs' peak FLOP/s is known (" + MFU_UNKNOWN + ").",
            "mfu",
        ),
        (
            "job_goodput_ratio",
            "Share of the job's wall time spent in productive step time at the "
            "straggler-free pace (0..1); the rest is job_badput_seconds.",
            "goodput_ratio",
        ),
        ("job_last_step", "Last closed step of the job.", "last_step"),
        ("job_world_size", "Ranks in the job.", "world_size"),
    ]
    for name, doc, attr in spec:
        fam = _gauge(name, doc, ["job_id"])
        for job in jobs:
            value = getattr(job, attr)
            if value is not None and math.isfinite(value):
                fam.add_metric([job.job_id], float(value))
        yield fam
    badput = _gauge(
        "job_badput_seconds",
        "Wall time lost by the job since it started, by reason ("
        + ", ".join(b.value for b in Badput)
        + "; stepwatch.contract.goodput).",
        ["job_id", "reason"],
    )
    for job in jobs:
        for reason, seconds in sorted(getattr(job, "badput_seconds", {}).items()):
            badput.add_metric([job.job_id, reason], float(seconds))
    yield badput
    hung = _gauge("job_hung", "1 while the job makes no progress (hang detected).", ["job_id"])
    stragglers = _gauge("job_stragglers", "Ranks currently flagged as stragglers.", ["job_id"])
    suspects = _gauge(
        "job_straggler_suspects",
        "Ranks slower than their peers now, but not (yet) "
        "material or lasting enough to be an incident: never paged "
        "(docs/detection.md, two tiers).",
        ["job_id"],
    )
    became = CounterMetricFamily(  # a name of its own: one family per name (OpenMetrics)
        "stepwatch_job_straggler_suspects_seen",
        "Ranks that became straggler suspects since the job started.",
        labels=["job_id"],
    )
    for job in jobs:
        hung.add_metric([job.job_id], 1.0 if job.hung else 0.0)
        stragglers.add_metric([job.job_id], float(len(job.flagged_ranks)))
        suspects.add_metric([job.job_id], float(len(job.suspect_ranks)))
        became.add_metric([job.job_id], float(job.suspects_total))
    yield hung
    yield stragglers
    yield suspects
    yield became


def _detection_families(snap: Snapshot) -> Iterator[Metric]:
    by_type: dict[tuple[str, str], int] = {}
    for det in snap.open:
        key = (det.job_id, det.type)
        by_type[key] = by_type.get(key, 0) + 1
    opened = _gauge(
        "job_open_detections", "Open detections of the job by type.", ["job_id", "type"]
    )
    for (job, type_), n in sorted(by_type.items()):
        opened.add_metric([job, type_], float(n))
    yield opened
    ranks = _gauge(
        "rank_flagged_score",
        "Score of a rank while an open detection names it, as the detection core reports "
        "it (docs/detection.md); the series is removed when the detection resolves.",
        list(RANK_LABELS),
    )
    for det in snap.open:
        if det.rank is None:
            continue
        score = snap.scores.get((det.job_id, det.rank), det.score)
        # the core puts the flagged rank's host in the header ("stepwatch" when unknown)
        host = det.evidence.get("host") if det.evidence else None
        host = host or (det.host if det.host != "stepwatch" else "")
        gpu = "" if det.gpu is None else str(det.gpu)
        labels = [det.job_id, str(det.rank), str(host or ""), gpu, det.type, det.cause]
        ranks.add_metric(labels, float("nan") if score is None else float(score))
    yield ranks
    yield _open_detections(snap.open)


def _open_detections(opened: tuple[DetectionMessage, ...]) -> Metric:
    fam = _gauge(
        "detection_score",
        "One series per open detection, labelled with its type, cause, fault class "
        "(system/user/unknown) and where it points; value: the core's score (straggler: excess "
        "busy share; job_slowdown: fraction slower than the job's own baseline; hang: seconds "
        "silent), 1 when the detection has none. Removed when the detection resolves.",
        list(DETECTION_LABELS),
    )
    seen: set[tuple[str, ...]] = set()
    for det in opened:
        labels = detection_labels(det)
        if labels in seen:
            continue
        seen.add(labels)
        score = det.score if det.score is not None and math.isfinite(det.score) else 1.0
        fam.add_metric(list(labels), float(score))
    return fam


def detection_labels(det: DetectionMessage) -> tuple[str, ...]:
    ev = det.evidence or {}
    host = ev.get("suspect_host") or ev.get("host") or (det.host if det.host != "stepwatch" else "")
    port = ev.get("port")
    return (
        det.job_id,
        det.type,
        det.cause,
        det.fault,
        "" if det.rank is None else str(det.rank),
        str(host or ""),
        "" if det.gpu is None else str(det.gpu),
        det.group,
        str(ev.get("device") or ""),
        "" if port is None else str(port),
    )


class StreamMetrics:
    """Every metric of one stream worker, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter(
            f"{NS}_stream_events",
            "Telemetry records consumed (step records, GPU readings, port readings, events).",
            ["kind"],
            registry=r,
        )
        self.messages = Counter(
            f"{NS}_stream_messages", "Kafka messages consumed.", ["kind"], registry=r
        )
        self.dlq = Counter(
            f"{NS}_stream_dlq_messages",
            "Messages sent to the dead-letter topic.",
            ["reason"],
            registry=r,
        )
        self.dropped = Counter(
            f"{NS}_stream_dropped_records",
            "Valid records dropped (duplicate, out_of_order, stale).",
            ["kind", "reason"],
            registry=r,
        )
        self.detections = Counter(
            f"{NS}_stream_detections",
            "Detection state changes emitted.",
            ["type", "state"],
            registry=r,
        )
        self.errors = Counter(
            f"{NS}_stream_errors",
            "Errors caught at the worker's loop edges.",
            ["where"],
            registry=r,
        )
        self.lag = Gauge(
            f"{NS}_stream_consumer_lag_messages",
            "Messages behind the high watermark, per input kind and partition.",
            ["kind", "partition"],
            registry=r,
        )
        self.ready = Gauge(
            f"{NS}_stream_ready",
            "1 when partitions are assigned, tables recovered and the worker is consuming.",
            registry=r,
        )
        self.partitions = Gauge(
            f"{NS}_stream_assigned_partitions",
            "Partitions (of each input topic) this worker owns.",
            registry=r,
        )
        self.jobs = Gauge(f"{NS}_stream_jobs", "Jobs analysed by this worker.", registry=r)
        self.unread = Gauge(
            f"{NS}_stream_unread_partitions",
            "Partitions whose input this worker cannot read now (an input topic's partition "
            "neither answered a fetch nor gave a record for stream_unread_seconds; or a "
            "stalled publish, a rebalance, a paused worker): their hang checks wait.",
            registry=r,
        )
        self.batch = Histogram(
            f"{NS}_stream_batch_seconds",
            "Processing time of one batch.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.job_collector = JobCollector()
        r.register(self.job_collector)

    def count_batch(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Add a batch's tallies: keys (family, label) as produced by the worker."""
        families: dict[str, Any] = {
            "events": self.events,
            "messages": self.messages,
            "dlq": self.dlq,
        }
        for (family, label), n in counts.items():
            families[family].labels(label).inc(n)

    def set_lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        self.lag.clear()
        for (kind, partition), value in lags.items():
            self.lag.labels(kind, str(partition)).set(value)


def serve(metrics: StreamMetrics, endpoint: Endpoint) -> int:
    """Serve /metrics (port 0 disables); return the port bound, 0 if none.

    Listen address, TLS and basic auth: :mod:`stepwatch.metrics_http`.
    """
    if endpoint.port <= 0:
        return 0
    return serve_metrics(metrics.registry, endpoint, name="stream").port
