"""A detection the worker builds from other fields stays a valid contract message.

The contract bounds free text (``Text``: 4,096 characters). A summary that quotes
an event's detail (``exception: <detail>``) of the full 4,096 characters would be
longer: every reader (the sink, the remediator's consumers) would refuse the
detection as ``schema``, and the incident would be lost. Producers clip it.
"""

from __future__ import annotations

import time

import pytest

from stepwatch.contract import (
    DetectionMessage,
    EventMessage,
    EventType,
    StepMessage,
    StepRecord,
    decode,
    encode,
)
from stepwatch.contract.records import TEXT_MAX
from stepwatch.streams.core import Engine
from tests.support.detect_synth import Job, drive, opened

pytestmark = pytest.mark.unit


def test_an_exception_of_the_longest_detail_opens_a_detection_every_reader_accepts() -> None:
    now = time.time()
    engine = Engine()
    steps = [
        StepRecord(job_id="j", rank=r, world_size=2, step=1, start=now - 2, end=now - 1)
        for r in range(2)
    ]
    engine.process(StepMessage(host="h1", ts=now - 1, job_id="j", steps=steps))
    detail = "Traceback (most recent call last):\n" + "x" * (TEXT_MAX - 35)
    assert len(detail) == TEXT_MAX
    ev = EventMessage(
        host="h1", ts=now, type=EventType.EXCEPTION, job_id="j", rank=1, detail=detail
    )
    decode(encode(ev))  # the event itself is valid
    (det,) = engine.process(ev)
    back = decode(encode(det))  # as the sink reads it
    assert isinstance(back, DetectionMessage) and back.type == "user_error"
    assert len(back.summary) == TEXT_MAX and back.summary.startswith("exception: Traceback")


def test_a_compute_straggler_without_gpu_telemetry_does_not_call_it_healthy() -> None:
    # the torch demo (no GPU collector): "compute longer than peers (GPU telemetry
    # healthy)" named a GPU no sample had been read from
    (d,) = opened(drive(Engine(), Job(world=16, steps=60, slow={3: (20, 1.5)}).messages()))
    assert d.cause == "gpu" and "compute longer than peers" in d.summary
    assert "no GPU telemetry" in d.summary and "healthy" not in d.summary
