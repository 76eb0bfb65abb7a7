"""Thousands of bad messages between good ones, through a real `stepwatch stream` worker.

Every bad one must land in the DLQ with its reason and its exact payload,
duplicates must be dropped (not dead-lettered), every good one must be
processed, and the straggler hidden in the good traffic must still be found —
with the right rank and cause, on the detections topic and on /metrics.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from collections import Counter
from collections.abc import Callable

import pytest

from stepwatch.contract import (
    DetectionMessage,
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Message,
    StepMessage,
    StepRecord,
    Topics,
    encode,
)
from stepwatch.kafka import ensure_topics
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.worker.dlq import decode_dead_letter, original_payload
from tests.support.stream_support import StreamWorker, publish, read_topic, wait_for

Raw = tuple[str, bytes | None, bytes]


def good_traffic(now: float) -> list[Message]:
    """Two jobs, rank 5 of fz-1 slow from step 30; the jobs are still running (no job_end)."""
    start = now - 110
    slow = Scenario(
        seed=7,
        job_id="fz-1",
        nodes=4,
        steps=90,
        start_ts=start,
        hosts=tuple(f"fa{n}" for n in range(4)),
        faults=(Fault(kind=FaultKind.SLOW_GPU, rank=5, start_step=30, severity=0.2),),
    )
    clean = Scenario(seed=8, job_id="fz-2", nodes=2, steps=90, start_ts=start, hosts=("fb0", "fb1"))
    return [
        m
        for m in simulate(slow, clean)
        if not (isinstance(m, EventMessage) and m.type == EventType.JOB_END)
    ]


def bad_traffic(topics: Topics, now: float, n: int) -> list[tuple[Raw, str]]:
    """``n`` bad records, each with a unique payload, and the reason each must get."""
    far = now + 86400

    def step(i: int, **kw: float) -> bytes:
        rec = {
            "job_id": "fz-1",
            "rank": 0,
            "world_size": 32,
            "step": 1,
            "start": now - 5,
            "end": now - 4,
            **kw,
        }
        return encode(
            StepMessage(host=f"bad-{i}", ts=now - 1, job_id="fz-1", steps=[StepRecord(**rec)])
        )  # type: ignore[arg-type]

    makers: list[tuple[str, str, Callable[[int], bytes]]] = [
        ("malformed_json", topics.steps, lambda i: b'{"kind": "step", "host": "bad-%d", oo' % i),
        ("malformed_json", topics.gpu, lambda i: b"\xff\xfe\x00" + struct.pack(">I", i)),
        ("malformed_json", topics.ports, lambda i: b"NaN%d" % i),
        ("schema", topics.steps, lambda i: b'{"kind":"step","host":"bad-%d","ts":"noon"}' % i),
        ("schema", topics.events, lambda i: b'{"host":"bad-%d","ts":1700000000}' % i),
        ("overflow", topics.gpu, lambda i: b'{"kind":"gpu","host":"bad-%d","ts":1e999}' % i),
        (
            "overflow",
            topics.gpu,
            lambda i: (
                b'{"kind":"gpu","host":"bad-%d","ts":1700000000,'
                b'"gpus":[{"index":0,"power_w":1e300}]}' % i
            ),
        ),
        (
            "overflow",
            topics.events,
            lambda i: (
                b'{"kind":"event","host":"bad-%d","ts":1700000000,'
                b'"type":"xid","code":%d}' % (i, 2**64)
            ),
        ),
        ("unknown_kind", topics.steps, lambda i: b'{"kind":"mood","host":"bad-%d","ts":1}' % i),
        (
            "unsupported_version",
            topics.steps,
            lambda i: b'{"kind":"step","v":7,"host":"bad-%d","ts":1700000000}' % i,
        ),
        ("absurd_value", topics.steps, lambda i: step(i, end=now - 50)),  # negative duration
        ("absurd_value", topics.steps, lambda i: step(i, start=far, end=far + 1)),  # future
        ("absurd_value", topics.steps, lambda i: step(i, rank=40)),  # rank >= world size
        (
            "absurd_value",
            topics.gpu,
            lambda i: encode(
                GpuMessage(host=f"bad-{i}", ts=now - 1, gpus=[GpuReading(index=0, power_w=-5.0)])
            ),
        ),
        ("wrong_topic", topics.steps, lambda i: encode(GpuMessage(host=f"bad-{i}", ts=now - 1))),
        (
            "wrong_topic",
            topics.events,
            lambda i: encode(DetectionMessage(host=f"bad-{i}", ts=now - 1, id=f"x{i}")),
        ),
    ]
    keys: list[bytes | None] = [b"fz-1", b"fz-2", None, b"nobody"]
    out = []
    for i, (reason, topic, make) in zip(range(n), itertools.cycle(makers), strict=False):
        out.append(((topic, keys[i % len(keys)], make(i)), reason))
    return out


def interleave(good: list[Message], bad: list[Raw]) -> list[Message | Raw]:
    out: list[Message | Raw] = []
    per = len(bad) / max(1, len(good))
    taken = 0
    for i, g in enumerate(good):
        out.append(g)
        upto = int((i + 1) * per)
        out.extend(bad[taken:upto])
        taken = upto
    return out + bad[taken:]


@pytest.mark.timeout(120)
def test_bad_input_goes_to_the_dlq_and_good_traffic_is_unaffected(settings, tmp_path) -> None:
    ensure_topics(settings)
    topics = Topics(settings.topic_prefix)
    worker = StreamWorker(settings, tmp_path, "fuzz").start()
    try:
        now = time.time()
        good = good_traffic(now)
        steps = [m for m in good if isinstance(m, StepMessage)]
        gpus = [m for m in good if isinstance(m, GpuMessage)]
        dup_steps, dup_gpus = steps[10:40], gpus[5:15]  # sent again, late
        bad = bad_traffic(topics, now, 3000)
        good_all: list[Message] = [*good, *dup_steps, *dup_gpus]
        sent = publish(settings, interleave(good_all, [b[0] for b in bad]))
        assert sent == len(good_all) + len(bad)

        wait_for(
            "every message consumed",
            lambda: worker.value("stepwatch_stream_messages_total") >= sent,
            90,
            [worker],
        )

        # every bad record in the DLQ, with its reason and exact payload; nothing else there
        expected = {raw[2]: reason for raw, reason in bad}
        letters = [decode_dead_letter(v) for _, v in read_topic(settings, topics.dlq)]
        got = {original_payload(x): x.reason for x in letters}
        assert len(letters) == len(bad) == len(got)
        assert got == expected
        assert all(x.detail and x.offset >= 0 and x.topic in topics.telemetry() for x in letters)
        by_reason = Counter(expected.values())
        for reason, n in by_reason.items():
            assert worker.value("stepwatch_stream_dlq_messages_total", reason=reason) == n

        # duplicates dropped, every good record processed exactly once
        assert worker.value("stepwatch_stream_dropped_records_total", kind="step") == sum(
            len(m.steps) for m in dup_steps
        )
        assert worker.value("stepwatch_stream_dropped_records_total", kind="gpu") == len(dup_gpus)
        assert worker.value("stepwatch_stream_events_total", kind="step") == sum(
            len(m.steps) for m in steps
        )
        assert worker.value("stepwatch_stream_events_total", kind="gpu") == sum(
            len(m.gpus) for m in gpus
        )

        # the straggler is still found: right rank and cause, and nothing on the clean job
        dets = [json.loads(v) for _, v in read_topic(settings, topics.detections)]
        opened = [(d["job_id"], d["type"], d["rank"]) for d in dets if d["state"] == "open"]
        assert ("fz-1", "straggler", 5) in opened
        assert not [o for o in opened if o[1] == "straggler" and o[2] != 5]
        # The traffic is one backlog, so a step can reach the engine before the
        # GPU samples of its second; the cause may then be corrected by an
        # update. What counts is the detection's latest word.
        latest = {d["id"]: d for d in dets}
        assert [
            (d["job_id"], d["rank"], d["cause"])
            for d in latest.values()
            if d["type"] == "straggler"
        ] == [("fz-1", 5, "gpu")]
        wait_for(
            "flagged rank on /metrics",
            lambda: (
                worker.value(
                    "stepwatch_rank_flagged_score",
                    job_id="fz-1",
                    rank="5",
                    type="straggler",
                    cause="gpu",
                    gpu="5",
                    host="fa0",
                )
                > 0
            ),
            10,
            [worker],
        )
        assert worker.value("stepwatch_stream_ready") == 1
        assert "fz-1" in worker.jobs() and "fz-2" in worker.jobs()
    finally:
        code = worker.stop()
    assert code == 0, worker.log[-3000:]
    assert "stream worker stopped" in worker.log
    assert "Traceback" not in worker.log, worker.log[-3000:]
