"""Scale-out is Kafka's: two `stepwatch stream` processes in one consumer group split
the partitions, both do work, and every job is analysed by exactly one of them."""

from __future__ import annotations

import json
import time
import zlib

import pytest

from stepwatch.contract import EventMessage, EventType, Topics
from stepwatch.kafka import ensure_topics
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from tests.support.stream_support import StreamWorker, publish, read_topic, wait_for


def spread_job_ids(partitions: int, per_partition: int) -> list[str]:
    """Job ids that cover every partition under librdkafka's default partitioner (CRC32)."""
    ids: list[str] = []
    count = dict.fromkeys(range(partitions), 0)
    for i in range(1000):
        job = f"sc-{i}"
        p = zlib.crc32(job.encode()) % partitions
        if count[p] < per_partition:
            count[p] += 1
            ids.append(job)
        if len(ids) == partitions * per_partition:
            return ids
    raise AssertionError("no spread found")


@pytest.mark.timeout(150)
def test_two_workers_split_the_partitions(settings, tmp_path) -> None:
    ensure_topics(settings)
    topics = Topics(settings.topic_prefix)
    # w2 runs Faust's stock consumer loop, so both consumer paths stay tested.
    workers = [
        StreamWorker(settings, tmp_path, "w1").start(),
        StreamWorker(settings, tmp_path, "w2", extra=["--stock-consumer"]).start(),
    ]
    try:
        wait_for(
            "both workers ready with a share of the partitions",
            lambda: (
                all(
                    w.value("stepwatch_stream_ready") == 1
                    and w.value("stepwatch_stream_assigned_partitions") >= 1
                    for w in workers
                )
                and sum(w.value("stepwatch_stream_assigned_partitions") for w in workers)
                == settings.partitions
            ),
            60,
            workers,
        )

        jobs = spread_job_ids(settings.partitions, 2)
        start = time.time() - 70
        scenarios = [
            Scenario(
                seed=i + 1,
                job_id=job,
                nodes=2,
                steps=60,
                start_ts=start,
                hosts=(f"{job}-n0", f"{job}-n1"),
                faults=(Fault(kind=FaultKind.SLOW_GPU, rank=3, start_step=15, severity=0.25),)
                if i == 0
                else (),
            )
            for i, job in enumerate(jobs)
        ]
        messages = [
            m
            for m in simulate(*scenarios)
            if not (isinstance(m, EventMessage) and m.type == EventType.JOB_END)
        ]
        sent = publish(settings, messages)
        wait_for(
            "every message consumed",
            lambda: sum(w.value("stepwatch_stream_messages_total") for w in workers) >= sent,
            60,
            workers,
        )

        consumed = [w.value("stepwatch_stream_messages_total") for w in workers]
        assert all(c > 0 for c in consumed), consumed
        assert sum(consumed) == sent  # nothing read twice
        wait_for(
            "job series on both workers",
            lambda: (
                all(w.jobs() for w in workers)
                and set().union(*(w.jobs() for w in workers)) == set(jobs)
            ),
            10,
            workers,
        )
        owned = [w.jobs() for w in workers]
        assert not owned[0] & owned[1], owned  # no job analysed twice
        assert owned[0] | owned[1] == set(jobs)

        dets = [json.loads(v) for _, v in read_topic(settings, topics.detections)]
        opens = [
            (d["job_id"], d["rank"])
            for d in dets
            if d["state"] == "open" and d["type"] == "straggler"
        ]
        assert opens == [(jobs[0], 3)]  # found once, by the one worker that owns the job
        owner = next(w for w in workers if jobs[0] in w.jobs())
        assert owner.value("stepwatch_stream_detections_total", type="straggler", state="open") == 1
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0], [w.log[-2000:] for w in workers]
