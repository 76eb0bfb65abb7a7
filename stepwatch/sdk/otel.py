"""OpenTelemetry spans for steps and phases, built after the fact.

A span costs ~15 µs to make, so none is made on the training thread: the
sender thread builds a ``stepwatch.step`` span per step and a child span per
phase from the recorded marks, with explicit start and end timestamps (epoch
ns), and hands them to the user's TracerProvider (and so to whatever span
processors and exporters it has). opentelemetry is imported only when enabled.
"""

from __future__ import annotations

from typing import Any

from stepwatch.sdk.phases import canonical
from stepwatch.sdk.resolve import Resolved

TRACER_NAME = "stepwatch.sdk"
STEP_SPAN = "stepwatch.step"


class SpanBuilder:
    """Turns resolved steps into OTel spans on the given (or global) TracerProvider."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import trace

        from stepwatch import __version__

        self._trace = trace
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer(TRACER_NAME, __version__)

    def emit(self, step: Resolved) -> None:
        ident = step.identity
        attrs: dict[str, Any] = {
            "stepwatch.job_id": ident.job_id,
            "stepwatch.rank": ident.rank,
            "stepwatch.world_size": ident.world_size,
            "stepwatch.local_rank": ident.local_rank,
            "stepwatch.host": ident.host,
            "stepwatch.group": ident.group,
            "stepwatch.step": step.number,
            "stepwatch.samples": step.samples,
            "stepwatch.tokens": step.tokens,
            "stepwatch.timing": step.timing,
        }
        if ident.gpu is not None:
            attrs["stepwatch.gpu"] = ident.gpu
        if step.loss is not None:
            attrs["stepwatch.loss"] = step.loss
        if step.loss_nonfinite:
            attrs["stepwatch.loss_nonfinite"] = True
        if step.flops is not None:
            attrs["stepwatch.flops"] = step.flops
        parent = self._tracer.start_span(STEP_SPAN, start_time=step.start_ns, attributes=attrs)
        context = self._trace.set_span_in_context(parent)
        for name, begin, end in step.spans:
            phase = canonical(name)
            span = self._tracer.start_span(
                phase.value if phase is not None else name,
                context=context,
                start_time=step.start_ns + begin,
                attributes={
                    "stepwatch.phase": phase.value if phase is not None else "extra",
                    "stepwatch.phase.name": name,
                    "stepwatch.step": step.number,
                },
            )
            span.end(end_time=step.start_ns + max(begin, end))
        parent.end(end_time=step.start_ns + step.duration_ns)
