"""StreamProcessor without a broker: routing, DLQ, dedup, partitions, detections."""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import (
    DetectionMessage,
    GpuMessage,
    GpuReading,
    Message,
    StepMessage,
    StepRecord,
    Topics,
    decode,
    encode,
)
from stepwatch.streams.core.api import JobStats
from stepwatch.streams.worker.dlq import decode_dead_letter, original_payload
from stepwatch.streams.worker.processor import Record, StreamProcessor

TOPICS = Topics("t")
T0 = 1_700_000_000.0


class FakeEngine:
    """Test double: flags rank 5 on step 10, resolves it on step 20; raises on step 666."""

    def __init__(self) -> None:
        self.seen: list[Message] = []
        self.arrivals: list[float | None] = []
        self.ticks: list[float] = []

    def process(self, message: Message, arrived: float | None = None) -> list[DetectionMessage]:
        self.seen.append(message)
        self.arrivals.append(arrived)
        out = []
        for rec in getattr(message, "steps", []):
            if rec.step == 666:
                raise RuntimeError("core bug")
            if rec.rank == 5 and rec.step in (10, 20):
                state = "open" if rec.step == 10 else "resolved"
                out.append(
                    DetectionMessage(
                        host="w",
                        ts=rec.end,
                        id="d5",
                        job_id=rec.job_id,
                        type="straggler",
                        state=state,
                        rank=5,
                        gpu=5,
                        cause="gpu",
                        score=0.12,
                        evidence={"host": rec.host},
                    )
                )
        return out

    def tick(self, now: float) -> list[DetectionMessage]:
        self.ticks.append(now)
        return []

    def forget(self, job_id: str, now: float, why: str) -> list[DetectionMessage]:
        return []

    def forget_host(self, host: str) -> None:
        pass

    def stats(self) -> list[JobStats]:
        jobs = {r.job_id for m in self.seen for r in getattr(m, "steps", [])}
        return [
            JobStats(
                job_id=j,
                last_step=20,
                world_size=8,
                step_seconds_median=1.0,
                samples_per_second=64.0,
                tokens_per_second=1e5,
                mfu=0.4,
                goodput_ratio=0.9,
                hung=False,
                open_detections=0,
                flagged_ranks={5: 0.12},
                badput_seconds={"checkpoint": 4.0},
                suspect_ranks={2: 0.03, 6: 0.02},
                suspects_total=3,
            )
            for j in sorted(jobs)
        ]


def step_msg(step: int, ranks: range = range(8), job: str = "j") -> bytes:
    recs = [
        StepRecord(
            job_id=job,
            rank=r,
            world_size=8,
            step=step,
            start=T0 + step,
            end=T0 + step + 1,
            host=f"h{r // 4}",
        )
        for r in ranks
    ]
    return encode(StepMessage(host="h0", ts=T0 + step + 1, job_id=job, steps=recs))


def rec(
    topic: str, value: bytes, partition: int = 0, offset: int = 0, key: bytes | None = b"j"
) -> Record:
    return Record(topic, partition, offset, key, value)


@pytest.fixture()
def proc() -> StreamProcessor:
    return StreamProcessor(TOPICS, FakeEngine, worker="w1", clock=lambda: T0 + 10_000)


def test_valid_messages_reach_the_engine_and_detections_come_out(proc: StreamProcessor) -> None:
    out = proc.process_batch(
        [rec(TOPICS.steps, step_msg(s), offset=s, partition=2) for s in range(9, 12)]
    )
    assert len(out) == 1
    o = out[0]
    assert (o.topic, o.key, o.partition) == (TOPICS.detections, b"j", 2)
    d = decode(o.value)
    assert isinstance(d, DetectionMessage) and (d.rank, d.cause, d.state) == (5, "gpu", "open")
    engine = proc.states[2].engine
    assert isinstance(engine, FakeEngine) and len(engine.seen) == 3
    # each message arrives on the worker's clock, the one it ticks on (docs/detection.md,
    # "Clocks"), not at the timestamp its host wrote
    assert engine.arrivals == [T0 + 10_000] * 3
    assert proc.metrics.events.labels("step")._value.get() == 24
    assert proc.metrics.messages.labels("step")._value.get() == 3


BAD = [
    (b"", "malformed_json"),
    (b"\xff\xfe\x00garbage", "malformed_json"),
    (b'{"kind": "step", "host": "h", "ts": "noon"}', "schema"),
    (b'{"host": "h", "ts": 1700000000}', "schema"),
    (b'{"kind": "telepathy", "host": "h", "ts": 1700000000}', "unknown_kind"),
    (b'{"kind": "step", "v": 9, "host": "h", "ts": 1700000000}', "unsupported_version"),
    (
        encode(
            StepMessage(
                host="h",
                ts=T0,
                steps=[StepRecord(job_id="j", rank=0, world_size=1, step=1, start=T0, end=T0 - 5)],
            )
        ),
        "absurd_value",
    ),
    (encode(StepMessage(host="h", ts=T0 + 86400, steps=[])), "absurd_value"),
    (encode(GpuMessage(host="h", ts=T0, gpus=[GpuReading(index=0)])), "wrong_topic"),
    (encode(DetectionMessage(host="h", ts=T0, id="x")), "wrong_topic"),
]


def test_every_bad_record_goes_to_the_dlq_with_reason_and_origin(proc: StreamProcessor) -> None:
    batch = []
    for i, (payload, _) in enumerate(BAD):
        batch.append(rec(TOPICS.steps, step_msg(i), offset=2 * i, partition=1))
        batch.append(rec(TOPICS.steps, payload, offset=2 * i + 1, partition=1, key=b"k%d" % i))
    out = proc.process_batch(batch)
    letters = [decode_dead_letter(o.value) for o in out if o.topic == TOPICS.dlq]
    assert [(x.reason, x.offset) for x in letters] == [
        (r, 2 * i + 1) for i, (_, r) in enumerate(BAD)
    ]
    for letter, (payload, _) in zip(letters, BAD, strict=True):
        assert original_payload(letter) == payload
        assert (letter.topic, letter.partition, letter.worker) == (TOPICS.steps, 1, "w1")
        assert letter.detail
    assert [o.partition for o in out if o.topic == TOPICS.dlq] == [1] * len(BAD)
    assert letters[1].payload_encoding == "base64"
    engine = proc.states[1].engine
    assert isinstance(engine, FakeEngine) and len(engine.seen) == len(BAD)  # every good one
    assert proc.metrics.dlq.labels("malformed_json")._value.get() == 2


def test_core_exception_is_dead_lettered_and_the_batch_goes_on(proc: StreamProcessor) -> None:
    out = proc.process_batch(
        [rec(TOPICS.steps, step_msg(666, job="x")), rec(TOPICS.steps, step_msg(10))]
    )
    assert [o.topic for o in out] == [TOPICS.dlq, TOPICS.detections]
    assert decode_dead_letter(out[0].value).reason == "processing_error"
    assert proc.metrics.errors.labels("process")._value.get() == 1


def test_a_ranks_step_jump_of_2_to_the_62_costs_no_batch(proc: StreamProcessor) -> None:
    """A job's first message at steps 2^62 (rank 0) and 0 (rank 1), then rank 1 at
    2^62 + 1, passes the step-jump check (the job's peak) and raised MemoryError in the
    duplicate filter: the whole batch, every job on the partition, was lost."""
    big = 2**62

    def attack(pairs: list[tuple[int, int]]) -> bytes:
        recs = [
            StepRecord(job_id="x", rank=r, world_size=2, step=s, start=T0, end=T0 + 1)
            for r, s in pairs
        ]
        return encode(StepMessage(host="h9", ts=T0 + 1, job_id="x", steps=recs))

    out = proc.process_batch(
        [
            rec(TOPICS.steps, attack([(0, big), (1, 0)]), offset=0, key=b"x"),
            rec(TOPICS.steps, attack([(0, big + 1), (1, big + 1)]), offset=1, key=b"x"),
            rec(TOPICS.steps, step_msg(10), offset=2),
        ]
    )
    assert [o.topic for o in out] == [TOPICS.detections]  # the honest job's straggler
    engine = proc.states[0].engine
    assert isinstance(engine, FakeEngine) and len(engine.seen) == 3


def test_a_bug_in_the_duplicate_filter_costs_its_record_not_the_batch(
    proc: StreamProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate and the duplicate filter ran outside the core's guard: one exception there
    failed the batch, and the worker forgot every job of its partitions."""
    dedup = proc.state(0).dedup
    admit = dedup.admit

    def broken(message: Message) -> Message | None:
        if isinstance(message, StepMessage) and message.job_id == "x":
            raise OverflowError("filter bug")
        return admit(message)

    monkeypatch.setattr(dedup, "admit", broken)
    out = proc.process_batch(
        [
            rec(TOPICS.steps, step_msg(3, job="x"), offset=0),
            rec(TOPICS.steps, step_msg(10), offset=1),
        ]
    )
    assert [o.topic for o in out] == [TOPICS.dlq, TOPICS.detections]
    assert decode_dead_letter(out[0].value).reason == "processing_error"


def test_duplicates_are_dropped_not_dead_lettered(proc: StreamProcessor) -> None:
    out = proc.process_batch([rec(TOPICS.steps, step_msg(10), offset=o) for o in range(3)])
    assert len(out) == 1  # the detection once; the copies dropped
    assert proc.metrics.dropped.labels("step", "duplicate")._value.get() == 16
    assert proc.metrics.events.labels("step")._value.get() == 8


def test_revoked_partitions_lose_their_state(proc: StreamProcessor) -> None:
    proc.assign([0, 1])
    proc.process_batch(
        [
            rec(TOPICS.steps, step_msg(1), partition=0),
            rec(TOPICS.steps, step_msg(1, job="k"), partition=1),
        ]
    )
    assert set(proc.states) == {0, 1}
    proc.assign([1, 2])
    assert set(proc.states) == {1}
    proc.activate()
    assert set(proc.states) == {1, 2}
    assert [j.job_id for j in proc.stats()] == ["k"]
    assert proc.metrics.partitions._value.get() == 2


def test_tick_reaches_every_partition_and_refreshes_job_series(proc: StreamProcessor) -> None:
    proc.assign([0, 1])
    proc.activate()
    proc.process_batch([rec(TOPICS.steps, step_msg(10), partition=1)])
    proc.tick(T0 + 50)
    for st in proc.states.values():
        assert isinstance(st.engine, FakeEngine) and st.engine.ticks == [T0 + 50]
    text = metrics_text(proc)
    assert 'stepwatch_job_step_seconds{job_id="j"} 1.0' in text
    assert 'stepwatch_job_badput_seconds{job_id="j",reason="checkpoint"} 4.0' in text
    assert 'stepwatch_job_straggler_suspects{job_id="j"} 2.0' in text  # suspects: seen, not paged
    assert 'stepwatch_job_straggler_suspects_seen_total{job_id="j"} 3.0' in text
    # the page is valid OpenMetrics too: one family per name (a gauge and a counter once
    # shared "stepwatch_job_straggler_suspects", which a strict parser refuses)
    from prometheus_client.openmetrics import exposition, parser

    page = exposition.generate_latest(proc.metrics.registry).decode()
    names = [f.name for f in parser.text_string_to_metric_families(page)]
    assert len(names) == len(set(names)) and "stepwatch_job_step_seconds" in names
    assert (
        'stepwatch_rank_flagged_score{cause="gpu",gpu="5",host="h1",job_id="j",rank="5",'
        'type="straggler"} 0.12'
    ) in text
    proc.process_batch([rec(TOPICS.steps, step_msg(20), partition=1)])  # resolves rank 5
    proc.tick(T0 + 51)
    assert "stepwatch_rank_flagged_score{" not in metrics_text(proc)
    assert "stepwatch_job_open_detections{" not in metrics_text(proc)


def test_lag_per_kind_and_partition(proc: StreamProcessor) -> None:
    proc.assign([0])
    proc.process_batch([rec(TOPICS.steps, step_msg(1), offset=41)])
    high = {TOPICS.steps: 50, TOPICS.gpu: 7}
    lag = proc.lag(lambda t, p: high.get(t), position=lambda t, p: 6 if t == TOPICS.gpu else None)
    assert lag == {("step", 0): 8, ("gpu", 0): 0}


def metrics_text(proc: StreamProcessor) -> str:
    from prometheus_client import generate_latest

    return generate_latest(proc.metrics.registry).decode()


def test_real_engine_finds_the_simulated_straggler() -> None:
    from stepwatch.contract import KIND_OF, message_key
    from stepwatch.settings import Settings
    from stepwatch.sim import Fault, FaultKind, Scenario, simulate
    from stepwatch.streams.worker.app import default_engine_factory

    sc = Scenario(
        seed=3,
        job_id="sim",
        nodes=4,
        gpus_per_node=8,
        steps=90,
        start_ts=T0,
        faults=(Fault(kind=FaultKind.SLOW_GPU, rank=13, start_step=30, severity=0.2),),
    )
    proc = StreamProcessor(
        TOPICS, default_engine_factory(Settings.load(env={})), clock=lambda: T0 + 200
    )
    records = [
        rec(TOPICS.for_kind(KIND_OF[type(m)]), encode(m), key=message_key(m), offset=i)
        for i, m in enumerate(simulate(sc))
    ]
    out = [
        msgspec.json.decode(o.value)
        for i in range(0, len(records), 500)
        for o in proc.process_batch(records[i : i + 500])
    ]
    opened = [d for d in out if d["state"] == "open" and d["type"] == "straggler"]
    assert [(d["rank"], d["cause"]) for d in opened] == [(13, "gpu")]
