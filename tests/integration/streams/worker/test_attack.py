"""Attacks on the second boundary, the stream worker: each through a real `stepwatch stream`.

A record that is valid on its own (the contract passes it) but claims what no
real job does must not move a high-water mark that real data is then judged
against: it goes to the DLQ with its reason and the real data goes on being
analysed (docs/security.md, "Boundary 2"). One broker and one worker carry
all the attacks at once, each on its own job or host:

* ``atk-jump``: one record says rank 0 of a 4-rank job is at step 10^9;
* ``ga0``: one GPU sample of a host stamped 290 s in the future;
* ``atk-end``: a ``job_end`` for a job, sent by a host that runs none of it;
* ``old0``: a GPU sample 200 days old.
"""

from __future__ import annotations

import json
import time

import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Message,
    StepMessage,
    StepRecord,
    Topics,
)
from stepwatch.kafka import ensure_topics
from stepwatch.streams.worker.dlq import decode_dead_letter
from tests.support.stream_support import StreamWorker, publish, read_topic, wait_for

pytestmark = pytest.mark.integration

STEPS = 60
JUMP_AT = 20  # the forged step 10^9 comes after this many real steps


def steps(
    job: str, host: str, ranks: range, world: int, t0: float, n: int, first: int = 0
) -> list[StepMessage]:
    return [
        StepMessage(
            host=host,
            ts=t0 + s + 1,
            job_id=job,
            steps=[
                StepRecord(
                    job_id=job, rank=r, world_size=world, step=s, start=t0 + s, end=t0 + s + 0.9
                )
                for r in ranks
            ],
        )
        for s in range(first, first + n)
    ]


def gpus(host: str, t0: float, n: int) -> list[GpuMessage]:
    return [
        GpuMessage(host=host, ts=t0 + i, gpus=[GpuReading(index=0, power_w=300.0)])
        for i in range(n)
    ]


def traffic(now: float) -> list[Message]:
    t0 = now - STEPS - 5
    jump = steps("atk-jump", "ja0", range(4), 4, t0, STEPS)
    forged = StepMessage(
        host="ja0",
        ts=t0 + JUMP_AT,
        job_id="atk-jump",
        steps=[
            StepRecord(
                job_id="atk-jump",
                rank=0,
                world_size=4,
                step=10**9,
                start=t0 + JUMP_AT - 0.5,
                end=t0 + JUMP_AT,
            )
        ],
    )
    gpu = gpus("ga0", t0, STEPS)
    future = GpuMessage(host="ga0", ts=now + 290, gpus=[GpuReading(index=0, power_w=1.0)])
    old = GpuMessage(host="old0", ts=now - 200 * 86400, gpus=[GpuReading(index=0)])
    end = steps("atk-end", "ea0", range(3), 4, t0, STEPS)  # rank 3 never reports
    return [*jump[:JUMP_AT], forged, *jump[JUMP_AT:], *gpu[:10], future, *gpu[10:], old, *end]


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """The attacks through one worker; then a forged job_end once a real detection is open."""
    from stepwatch.daemons.broker import DevBroker
    from stepwatch.settings import Settings

    work = tmp_path_factory.mktemp("attack-stream")
    with DevBroker(log_path=str(work / "broker.log")) as broker:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            topic_prefix="as",
            partitions=2,
            metrics_port=0,
            stream_metrics_port=0,
        )
        ensure_topics(settings)
        topics = Topics(settings.topic_prefix)
        worker = StreamWorker(settings, work, "attacked").start()
        try:
            sent = publish(settings, traffic(time.time()))
            wait_for(
                "every message consumed",
                lambda: worker.value("stepwatch_stream_messages_total") >= sent,
                90,
                [worker],
            )
            wait_for(
                "the real rank_missing of atk-end",
                lambda: open_of(settings, topics, "atk-end", "rank_missing"),
                60,
                [worker],
            )
            forged_end = EventMessage(
                host="evil-host", ts=time.time(), job_id="atk-end", type=EventType.JOB_END
            )
            sent += publish(settings, [forged_end])
            wait_for(
                "the forged job_end consumed",
                lambda: worker.value("stepwatch_stream_messages_total") >= sent,
                30,
                [worker],
            )
            time.sleep(8)  # ticks past the 5 s assembly deadline: a job_end has closed all by now
            result = {
                "dlq": [decode_dead_letter(v) for _, v in read_topic(settings, topics.dlq)],
                "detections": [json.loads(v) for _, v in read_topic(settings, topics.detections)],
                "dropped_gpu": worker.value("stepwatch_stream_dropped_records_total", kind="gpu"),
                "dlq_too_old": worker.value(
                    "stepwatch_stream_dlq_messages_total", reason="too_old"
                ),
                "gpu_events": worker.value("stepwatch_stream_events_total", kind="gpu"),
                "jump_last_step": worker.value("stepwatch_job_last_step", job_id="atk-jump"),
            }
        finally:
            code = worker.stop()
        assert code == 0, worker.log[-3000:]
        assert "Traceback" not in worker.log, worker.log[-3000:]
        yield result


def open_of(settings, topics: Topics, job: str, kind: str) -> list[dict]:
    dets = [json.loads(v) for _, v in read_topic(settings, topics.detections)]
    return [d for d in dets if d["job_id"] == job and d["type"] == kind and d["state"] == "open"]


def reasons(result: dict, host: str) -> list[str]:
    return [x.reason for x in result["dlq"] if f'"host":"{host}"' in x.payload]


@pytest.mark.timeout(240)
def test_a_step_of_1e9_is_dead_lettered_and_the_ranks_real_steps_go_on(attacked):
    # the rank's real steps were analysed to the end, and no false rank_missing paged
    jump = [d for d in attacked["detections"] if d["job_id"] == "atk-jump"]
    assert [d for d in jump if d["type"] == "rank_missing"] == []
    assert attacked["jump_last_step"] >= STEPS - 5
    assert reasons(attacked, "ja0") == ["step_jump"]
    letter = next(x for x in attacked["dlq"] if x.reason == "step_jump")
    assert "1000000000" in letter.detail and "atk-jump" in letter.detail


@pytest.mark.timeout(240)
def test_a_gpu_sample_from_the_future_does_not_hide_the_hosts_real_samples(attacked):
    assert attacked["dropped_gpu"] == 0  # no real sample dropped as out of order
    assert attacked["gpu_events"] == STEPS  # every real GPU sample of ga0 reached the core
    assert reasons(attacked, "ga0") == ["future_timestamp"]


@pytest.mark.timeout(240)
def test_a_job_end_from_a_foreign_host_closes_nothing(attacked):
    ends = [d for d in attacked["detections"] if d["job_id"] == "atk-end"]
    opened = {d["id"] for d in ends if d["state"] == "open" and d["type"] == "rank_missing"}
    assert opened, "the real detection opened"
    assert not [d for d in ends if d["id"] in opened and d["state"] == "resolved"]
    assert reasons(attacked, "evil-host") == ["foreign_lifecycle"]
    # detections say which worker produced them
    assert {d.get("producer") for d in ends} == {"attacked"}


@pytest.mark.timeout(240)
def test_a_message_200_days_old_is_dead_lettered_and_counted(attacked):
    assert reasons(attacked, "old0") == ["too_old"]
    assert attacked["dlq_too_old"] == 1
