"""A step record's ``world_size``: bounded, and a new size only from the job's own hosts.

Before: the detection core takes a step record with another ``world_size`` for
a restart of the job and closes all its open detections ("job restarted with
N ranks"), so one record from any host, the job's or not, resolved a real hang
(the ``job_end`` of a foreign host was already refused); and the core's memory
per job grows with the size a record claims (a single record of 2^20 ranks
cost the worker ~2 GiB), whatever ranks really report.
"""

from __future__ import annotations

import pytest

from stepwatch.contract import StepMessage, StepRecord, Topics, decode, encode
from stepwatch.contract.records import DetectionMessage
from stepwatch.settings import Settings
from stepwatch.streams.worker.admission import Gate
from stepwatch.streams.worker.app import admission_config, default_engine_factory
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Record, StreamProcessor

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0


def msg(
    step: int,
    host: str = "gpu-001",
    world: int = 2,
    ranks: tuple[int, ...] = (0, 1),
    start: float | None = None,
) -> StepMessage:
    s = T0 + step if start is None else start
    return StepMessage(
        host=host,
        ts=s + 1,
        job_id="j",
        steps=[
            StepRecord(job_id="j", rank=r, world_size=world, step=step, start=s, end=s + 0.9)
            for r in ranks
        ],
    )


def _det(value: bytes) -> DetectionMessage:
    det = decode(value)
    assert isinstance(det, DetectionMessage)
    return det


def _hung_job(now: float) -> tuple[StreamProcessor, Topics, list[DetectionMessage]]:
    topics = Topics("t")
    clock = [T0 + 61]  # the worker's clock: records arrive as they are sent, then time passes
    proc = StreamProcessor(
        topics, default_engine_factory(Settings.load(env={})), worker="w", clock=lambda: clock[0]
    )
    proc.process_batch([Record(topics.steps, 0, i, b"j", encode(msg(i))) for i in range(60)])
    opened: list[DetectionMessage] = []
    for k in range(1, 400, 5):
        clock[0] = T0 + 60 + k
        opened += [_det(o.value) for o in proc.tick(clock[0]) if o.topic == topics.detections]
    clock[0] = now
    return proc, topics, opened


def _detections(proc: StreamProcessor, topics: Topics, offset: int, m: StepMessage) -> tuple:
    out = proc.process_batch([Record(topics.steps, 0, offset, b"j", encode(m))])
    dets = [_det(o.value) for o in out if o.topic == topics.detections]
    letters = [decode_dead_letter(o.value).reason for o in out if o.topic == topics.dlq]
    return dets, letters


def test_a_foreign_hosts_resize_does_not_close_the_jobs_hang() -> None:
    now = T0 + 500
    proc, topics, opened = _hung_job(now)
    assert [(d.type, d.state) for d in opened] == [("hang", "open")]
    dets, letters = _detections(
        proc, topics, 100, msg(1, host="evil", world=3, ranks=(0,), start=T0 + 460)
    )
    assert dets == [] and letters == ["foreign_lifecycle"]
    # the job's own host may restart it with another size
    dets, letters = _detections(proc, topics, 101, msg(1, world=3, ranks=(0,), start=T0 + 461))
    assert letters == [] and [(d.type, d.state) for d in dets] == [("hang", "resolved")]


def test_a_world_size_over_the_bound_is_refused() -> None:
    gate = Gate(admission_config(Settings.load(env={})))
    refused = gate.admit(msg(1, world=1 << 20, ranks=(0,)), T0 + 10)
    assert refused.message is None and [r.reason.value for r in refused.refusals] == ["world_size"]
    assert gate.admit(msg(1, world=16384, ranks=(0,)), T0 + 10).refusals == []
    no_world = {"STEPWATCH_STREAM_MAX_WORLD_SIZE": "0"}
    off = Gate(admission_config(Settings.load(env=no_world)))
    # the worker's rank budget (stream_max_ranks) still bounds it
    refused = off.admit(msg(1, world=1 << 20, ranks=(0,)), T0 + 10)
    assert [r.reason.value for r in refused.refusals] == ["capacity"]
    off = Gate(admission_config(Settings.load(env={**no_world, "STEPWATCH_STREAM_MAX_RANKS": "0"})))
    assert off.admit(msg(1, world=1 << 20, ranks=(0,)), T0 + 10).refusals == []
