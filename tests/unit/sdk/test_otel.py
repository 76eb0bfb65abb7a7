"""OTel spans built off the hot path, with explicit timestamps from the marks."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stepwatch
from stepwatch.sdk.otel import STEP_SPAN
from tests.support.sdk_agent import FakeAgent


class ThreadOfStart(SpanProcessor):
    """Records which thread started each span."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.threads.add(threading.get_ident())


@pytest.fixture()
def traced() -> tuple[TracerProvider, InMemorySpanExporter, ThreadOfStart]:
    exporter = InMemorySpanExporter()
    threads = ThreadOfStart()
    provider = TracerProvider()
    provider.add_span_processor(threads)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter, threads


def test_step_and_phase_spans_with_explicit_timestamps(
    agent: FakeAgent, traced: tuple[TracerProvider, InMemorySpanExporter, ThreadOfStart]
) -> None:
    provider, exporter, threads = traced
    sw = stepwatch.init(
        "job-o",
        rank=2,
        world_size=4,
        agent_socket=agent.path,
        env={},
        tracer_provider=provider,
        flush_interval=0.01,
    )
    with sw.step(samples=16, tokens=4096) as s:
        with s.phase("data"):
            time.sleep(0.003)
        with s.phase("forward"):
            time.sleep(0.002)
        with s.phase("all-grads-sync"):
            pass
        with s.phase("custom-thing"):
            pass
        s.loss = 3.5
    ended_at_ns = time.time_ns()
    time.sleep(0.05)  # spans are built later: their timestamps must be the marks', not "now"
    assert sw.flush(2.0)
    (got,) = agent.steps()
    record = got.step
    spans: list[ReadableSpan] = list(exporter.get_finished_spans())
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {STEP_SPAN, "data", "forward", "comm_wait", "custom-thing"}
    step = by_name[STEP_SPAN]
    assert step.parent is None
    assert step.start_time is not None and step.end_time is not None
    assert step.start_time == pytest.approx(record.start * 1e9, abs=1_000)
    assert step.end_time == pytest.approx(record.end * 1e9, abs=1_000)
    # the SDK's epoch times are perf_counter marks plus an anchor to the wall clock (see
    # sdk/resolve.py): they may differ from time.time_ns() by a little (CI: 0.19 ms), far
    # less than the 50 ms a span stamped at build time would be late by
    assert step.end_time <= ended_at_ns + 10_000_000
    assert step.attributes is not None
    assert step.attributes["stepwatch.job_id"] == "job-o"
    assert step.attributes["stepwatch.rank"] == 2
    assert step.attributes["stepwatch.step"] == 0
    assert step.attributes["stepwatch.loss"] == 3.5
    assert record.phases is not None
    durations = {
        "data": record.phases.data,
        "forward": record.phases.forward,
        "comm_wait": record.phases.comm_wait,
        "custom-thing": record.phases.extra["custom-thing"],
    }
    previous_end = step.start_time
    for name in ("data", "forward", "comm_wait", "custom-thing"):
        span = by_name[name]
        assert span.parent is not None
        assert span.parent.span_id == step.context.span_id  # type: ignore[union-attr]
        assert span.start_time is not None and span.end_time is not None
        assert previous_end <= span.start_time <= span.end_time <= step.end_time
        assert (span.end_time - span.start_time) / 1e9 == pytest.approx(durations[name], abs=1e-6)
        previous_end = span.end_time
    assert by_name["data"].end_time - by_name["data"].start_time >= 3_000_000  # type: ignore[operator]
    assert by_name["comm_wait"].attributes == {
        "stepwatch.phase": "comm_wait",
        "stepwatch.phase.name": "all-grads-sync",
        "stepwatch.step": 0,
    }
    assert threading.get_ident() not in threads.threads  # none made on the training thread
    sw.close()


def test_no_spans_unless_enabled(
    agent: FakeAgent, traced: tuple[TracerProvider, InMemorySpanExporter, ThreadOfStart]
) -> None:
    provider, exporter, _ = traced
    sw = stepwatch.init("j", agent_socket=agent.path, env={}, tracer_provider=provider, otel=False)
    with sw.step() as s, s.phase("forward"):
        pass
    sw.close()
    assert exporter.get_finished_spans() == ()
    assert len(agent.steps()) == 1
