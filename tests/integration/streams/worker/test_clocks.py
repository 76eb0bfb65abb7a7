"""The real worker, fed live by hosts whose clocks are off from the worker's.

Two jobs report steps every 0.25 s through the broker: one from hosts whose
clocks are 2 minutes behind the worker's, one from hosts 2 minutes ahead (the
admission gate lets a host be up to 5 minutes ahead and a day behind). Then both
stop. Before: the first job was called hung at the worker's first tick, and the
second one's real hang came 2 minutes late. Now neither opens anything while it
runs, and both hangs open a few seconds after the hang limit.
"""

from __future__ import annotations

import json
import time

import pytest

from stepwatch.contract import StepMessage, StepRecord, Topics
from stepwatch.kafka import ensure_topics
from tests.support.stream_support import StreamWorker, publish, read_topic, wait_for

pytestmark = pytest.mark.integration

OFFSETS = {"behind": -120.0, "ahead": 120.0}
STEP = 0.25
HANG_LIMIT = 4.0  # STEPWATCH_HANG_MIN_SECONDS (10 steps of 0.25 s are less)


def steps(job: str, step: int, now: float) -> list[StepMessage]:
    """One step of a 4-rank job on 2 hosts, stamped by hosts whose clock is off."""
    t = now + OFFSETS[job]
    return [
        StepMessage(
            host=f"{job}-{h}",
            ts=t,
            job_id=job,
            steps=[
                StepRecord(
                    job_id=job,
                    rank=2 * h + r,
                    world_size=4,
                    step=step,
                    start=t - STEP,
                    end=t - 0.001 * r,
                    host=f"{job}-{h}",
                )
                for r in range(2)
            ],
        )
        for h in range(2)
    ]


def opened(settings) -> list[tuple[str, str, float]]:  # type: ignore[no-untyped-def]
    topic = Topics(settings.topic_prefix).detections
    return [
        (d["job_id"], d["type"], time.time())
        for d in (json.loads(v) for _, v in read_topic(settings, topic))
        if d["state"] == "open"
    ]


@pytest.mark.timeout(120)
def test_hosts_two_minutes_off_neither_fake_nor_delay_a_hang(settings, tmp_path) -> None:
    ensure_topics(settings)
    worker = StreamWorker(
        settings, tmp_path, "w", env={"STEPWATCH_HANG_MIN_SECONDS": str(HANG_LIMIT)}
    ).start()
    try:
        wait_for("worker ready", lambda: worker.value("stepwatch_stream_ready") >= 1, 60, [worker])
        for step in range(32):  # 8 s of training
            publish(settings, [m for job in OFFSETS for m in steps(job, step, time.time())])
            time.sleep(STEP)
        stopped = time.time()
        wait_for(
            "every step read",
            lambda: worker.value("stepwatch_stream_messages_total") >= 32 * 4,
            30,
            [worker],
        )
        assert opened(settings) == [], "a detection opened while both jobs ran"
        hangs = wait_for(
            "both hangs",
            lambda: (
                {j for j, t, _ in opened(settings) if t == "hang"} >= set(OFFSETS)
                and opened(settings)
            ),
            30,
            [worker],
        )
        assert isinstance(hangs, list)
        late = max(t for _, _, t in hangs) - stopped
        # the limit, a tick (1 s), the last record's delay and this loop's polling
        assert late < HANG_LIMIT + 8, late
        assert {(j, t) for j, t, _ in hangs} == {(j, "hang") for j in OFFSETS}
    finally:
        assert worker.stop() == 0, worker.log[-3000:]
