"""A worker restart continues or resolves the open detections; it never re-opens them.

Worker A sees a job with two slow ranks and opens a straggler detection for
each, then stops on SIGTERM (clean: offsets committed, table flushed). Worker B
(same consumer group) inherits both from the open-detections table. In the
traffic after the restart rank 3 is still slow and rank 20 has recovered: B must
carry on rank 3's detection under its original id (``update``, no second
``open``) and resolve rank 20's, which its fresh core never confirms.
"""

from __future__ import annotations

import json
import time

import pytest

from stepwatch.contract import EventMessage, EventType, StepMessage, Topics
from stepwatch.kafka import ensure_topics
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from tests.support.stream_support import StreamWorker, publish, read_topic, wait_for

JOB = "rs-1"


def detections(settings) -> list[dict]:  # type: ignore[no-untyped-def]
    topic = Topics(settings.topic_prefix).detections
    return [
        d
        for d in (json.loads(v) for _, v in read_topic(settings, topic))
        if d["job_id"] == JOB and d["type"] == "straggler"
    ]


def states(dets: list[dict], rank: int) -> list[tuple[str, str]]:
    return [(d["state"], d["id"]) for d in dets if d["rank"] == rank]


@pytest.mark.timeout(150)
def test_restarted_worker_inherits_open_detections(settings, tmp_path) -> None:
    ensure_topics(settings)
    sc = Scenario(
        seed=11,
        job_id=JOB,
        nodes=4,
        steps=130,
        start_ts=time.time() - 150,
        faults=(
            Fault(kind=FaultKind.SLOW_GPU, rank=3, start_step=15, severity=0.25),
            Fault(kind=FaultKind.SLOW_GPU, rank=20, start_step=15, end_step=60, severity=0.25),
        ),
    )
    messages = [
        m for m in simulate(sc) if not (isinstance(m, EventMessage) and m.type == EventType.JOB_END)
    ]
    cut = max(
        m.ts for m in messages if isinstance(m, StepMessage) and any(r.step == 60 for r in m.steps)
    )
    before, after = [m for m in messages if m.ts <= cut], [m for m in messages if m.ts > cut]

    a = StreamWorker(settings, tmp_path, "a").start()
    try:
        sent = publish(settings, before)
        wait_for(
            "both stragglers opened by worker A",
            lambda: {d["rank"] for d in detections(settings) if d["state"] == "open"} >= {3, 20},
            60,
            [a],
        )
        wait_for(
            "phase 1 consumed", lambda: a.value("stepwatch_stream_messages_total") >= sent, 30, [a]
        )
    finally:
        assert a.stop() == 0, a.log[-3000:]
    opened = {d["rank"]: d["id"] for d in detections(settings) if d["state"] == "open"}

    b = StreamWorker(settings, tmp_path, "b", extra=["--restore-grace-steps", "30"]).start()
    try:
        wait_for(
            "worker B ready with the inherited detections",
            lambda: b.value("stepwatch_job_open_detections", job_id=JOB, type="straggler") == 2,
            60,
            [b],
        )
        publish(settings, after)
        wait_for(
            "rank 20 resolved and rank 3 continued",
            lambda: (
                ("resolved", opened[20]) in states(detections(settings), 20)
                and ("update", opened[3]) in states(detections(settings), 3)
            ),
            60,
            [b],
        )
        dets = detections(settings)
        assert [s for s, _ in states(dets, 3)].count("open") == 1  # never re-opened
        assert {i for _, i in states(dets, 3)} == {opened[3]}  # one id across the restart
        assert [s for s, _ in states(dets, 20)].count("open") == 1
        assert {i for _, i in states(dets, 20)} == {opened[20]}
        resolved = next(d for d in dets if d["rank"] == 20 and d["state"] == "resolved")
        assert "not confirmed" in resolved["summary"]
        wait_for(
            "only rank 3 still flagged on /metrics",
            lambda: (
                b.value("stepwatch_rank_flagged_score", job_id=JOB, rank="3") > 0
                and not any(
                    n == "stepwatch_rank_flagged_score" and lab.get("rank") == "20"
                    for n, lab, _ in b.samples()
                )
            ),
            10,
            [b],
        )
    finally:
        assert b.stop() == 0, b.log[-3000:]
