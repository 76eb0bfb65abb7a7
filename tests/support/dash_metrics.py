"""Real stepwatch metrics of a simulated run, served for a real Prometheus to scrape.

* the node agent (``Agent`` with its own /metrics) on ``node0001``, whose
  collector replays that host's simulated GPU and port samples and events
  (a slow GPU, congestion on one NIC, a link flap, an XID), one tick at a time;
* a stream worker's ``StreamMetrics``: the detection core over the whole run,
  its job stats and open detections as the worker publishes them, and the
  worker's counters;
* the sink's ``SinkMetrics`` with a batch, rows and a dead letter counted.

The remediator is another branch's service: its series are not served here
(dashboard panels over them are checked for a valid query only).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from stepwatch.agents.agent import Agent
from stepwatch.agents.collectors.base import CollectorHealth, HealthState, HostContext
from stepwatch.agents.metrics import registry_for
from stepwatch.contract import EventMessage, EventType, GpuMessage, Message, PortMessage
from stepwatch.exporters.clickhouse.sink_metrics import SinkMetrics
from stepwatch.settings import Settings
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import Engine
from stepwatch.streams.worker.metrics import Snapshot, StreamMetrics

JOB = "dash-job"
HOST = "node0001"


def scenario() -> Scenario:
    return Scenario(
        seed=11,
        job_id=JOB,
        nodes=2,
        steps=90,
        flops_per_token=6e9,
        eval_every=0,
        checkpoint_every=40,
        faults=(
            Fault(FaultKind.SLOW_GPU, rank=10, start_step=30, severity=0.3),
            Fault(FaultKind.NIC_CONGESTION, host=HOST, nic=3, start_step=50),
            Fault(FaultKind.LINK_FLAP, host=HOST, nic=5, start_step=60),
        ),
    )


class Replay:
    """A collector that hands out the host's simulated samples, one sample time per tick."""

    name = "sim"

    def __init__(self, messages: list[Message]) -> None:
        by_ts: dict[float, list[Message]] = {}
        for m in messages:
            if m.host == HOST and isinstance(m, GpuMessage | PortMessage | EventMessage):
                by_ts.setdefault(m.ts, []).append(m)
        self.ticks = [by_ts[t] for t in sorted(by_ts)]
        self.i = 0

    def collect(self, ctx: HostContext) -> list[Message]:
        batch = self.ticks[min(self.i, len(self.ticks) - 1)]
        self.i += 1
        out: list[Message] = []
        for m in batch:
            out.append(m.__class__(**{**_fields(m), "ts": ctx.now}))
        if self.i == 5:  # a counted XID on GPU 2
            out.append(EventMessage(host=HOST, ts=ctx.now, type=EventType.XID, gpu=2, code=79))
        return out

    def health(self) -> CollectorHealth:
        return CollectorHealth(HealthState.OK)

    def close(self) -> None:
        pass


def _fields(m: Any) -> dict[str, Any]:
    return {f: getattr(m, f) for f in m.__struct_fields__}


class NullSink:
    """Takes the agent's messages; reports publisher stats as a healthy Kafka publisher does."""

    def send(self, messages: Sequence[Message]) -> None:
        pass

    def stats(self) -> Any:
        spool = SimpleNamespace(
            records=12, bytes=4096, max_bytes=512 << 20, dropped={}, torn_frames=0
        )
        return SimpleNamespace(
            state=SimpleNamespace(value="up"),
            produced={"gpu": 10, "ports": 10},
            delivery_failures={},
            producer_resets=0,
            rewinds=0,
            spool=spool,
            last_success=time.time(),
        )

    def flush(self, timeout: float = 10.0) -> int:
        return 0

    def close(self, timeout: float = 0) -> None:
        pass


@dataclass
class Served:
    targets: dict[str, str]  # scrape job -> host:port
    _stop: threading.Event = field(default_factory=threading.Event)
    _servers: list[Any] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for server in self._servers:
            server.shutdown()
            server.server_close()


def stream_metrics(messages: list[Message]) -> StreamMetrics:
    metrics = StreamMetrics()
    engine = Engine()
    found = []
    for m in messages:
        found.extend(engine.process(m))
    opened = {d.id: d for d in found if d.state == "open"}
    for d in found:
        if d.state != "open":
            opened.pop(d.id, None)
        metrics.detections.labels(type=d.type, state=d.state).inc()
    jobs = tuple(engine.stats())
    scores = {(j.job_id, r): s for j in jobs for r, s in j.flagged_ranks.items()}
    metrics.job_collector.snapshot = Snapshot(jobs, tuple(opened.values()), scores)
    metrics.jobs.set(len(jobs))
    metrics.ready.set(1)
    metrics.partitions.set(8)
    for kind in ("steps", "gpu", "ports", "events"):
        metrics.messages.labels(kind=kind).inc(100)
        metrics.events.labels(kind=kind).inc(1000)
        metrics.lag.labels(kind=kind, partition="0").set(3)
    metrics.dlq.labels(reason="invalid").inc()
    metrics.dropped.labels(kind="steps", reason="duplicate").inc()
    metrics.errors.labels(where="batch").inc(0)
    metrics.batch.observe(0.01)
    return metrics


def sink_metrics() -> SinkMetrics:
    m = SinkMetrics()
    for table in ("step_events", "gpu_samples", "port_samples"):
        m.rows.labels(table=table).inc(1000)
        m.insert_seconds.labels(table=table).observe(0.02)
        m.retries.labels(table=table).inc(0)
    m.messages.labels(topic="stepwatch.steps").inc(500)
    m.batches.labels(kind="data").inc(5)
    m.dead.labels(reason="invalid").inc()
    m.duplicates.inc(0)
    m.lag.labels(topic="stepwatch.steps", partition="0").set(2)
    m.buffered.set(10)
    m.last_commit.set_to_current_time()
    m.ready.set(1)
    return m


def serve_all(tmp_spool: str) -> Served:
    messages = sorted(simulate(scenario().resolved()), key=lambda m: m.ts)
    settings = Settings.load(env={}, host=HOST, collectors="", spool_dir=tmp_spool)
    agent = Agent(settings, [Replay(messages)], NullSink())
    registries: dict[str, CollectorRegistry] = {
        "stepwatch-agent": registry_for(agent.snapshot),
        "stepwatch-stream": stream_metrics(messages).registry,
        "stepwatch-sink": sink_metrics().registry,
    }
    served = Served({})
    for job, registry in registries.items():
        server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        served._servers.append(server)
        served.targets[job] = f"127.0.0.1:{server.server_port}"
    agent.tick()

    def ticking() -> None:
        while not served._stop.wait(0.25):
            agent.tick()

    thread = threading.Thread(target=ticking, daemon=True)
    thread.start()
    served._threads.append(thread)
    return served


def names(registries: dict[str, CollectorRegistry]) -> Iterator[str]:
    for registry in registries.values():
        for family in registry.collect():
            for sample in family.samples:
                yield sample.name
