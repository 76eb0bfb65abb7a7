"""A partition the worker cannot read: its jobs' silence is not theirs (streams.worker.sight).

A job reports a step a second on partition 0 through the processor and the real
detection core (hang limit 60 s). Then the broker answers no fetch for 5 minutes:
before, the job was called hung a minute in; now nothing opens, the unread gauge
says so, and when the broker answers again the job goes on unflagged. A job that
really hung meanwhile is still found, on the time the worker could see it.
"""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import GpuMessage, GpuReading, StepMessage, StepRecord, Topics, encode
from stepwatch.settings import Settings
from stepwatch.streams.worker.admission import AdmissionConfig
from stepwatch.streams.worker.app import default_engine_factory
from stepwatch.streams.worker.processor import Record, StreamProcessor
from stepwatch.streams.worker.sight import Sight

pytestmark = pytest.mark.unit

TOPICS = Topics("t")
INPUTS = tuple(TOPICS.telemetry())
T0 = 1_700_000_000.0
OUTAGE = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def steps(step: int, now: float, offset: int) -> Record:
    recs = [
        StepRecord(job_id="j", rank=r, world_size=4, step=step, start=now - 1, end=now, host="h0")
        for r in range(4)
    ]
    value = encode(StepMessage(host="h0", ts=now, job_id="j", steps=recs))
    return Record(TOPICS.steps, 0, offset, b"j", value)


def gpu(now: float) -> Record:
    seq = int(now - T0)  # one a second: the duplicate filter keeps each
    value = encode(
        GpuMessage(host="h0", ts=now, seq=seq, gpus=[GpuReading(index=0, util_gpu_pct=90.0)])
    )
    return Record(TOPICS.gpu, 0, seq, b"h0", value)


def opened(outputs: list) -> list[str]:  # type: ignore[type-arg]
    docs = [msgspec.json.decode(o.value) for o in outputs if o.topic == TOPICS.detections]
    return [d["type"] for d in docs if d["state"] == "open"]


class Run:
    """Drive the processor second by second: steps while the job runs, ticks always; the
    broker answers every fetch of partition 0 (of ``answering`` topics) unless it is out."""

    def __init__(self, admission: AdmissionConfig | None = None) -> None:
        self.clock = Clock()
        self.proc = StreamProcessor(
            TOPICS,
            default_engine_factory(Settings.load(env={})),
            clock=self.clock,
            admission=admission,
        )
        self.proc.assign([0])
        self.step = 0
        self.opened: list[tuple[float, str]] = []
        self.answers: dict[tuple[str, int], float | None] = {(t, 0): T0 for t in INPUTS}

    def seconds(
        self,
        n: int,
        *,
        stepping: bool,
        unanswered: bool = False,
        answering: tuple[str, ...] = INPUTS,
        gpus: bool = False,
    ) -> None:
        for _ in range(n):
            self.clock.now += 1.0
            now = self.clock.now
            batch = [steps(self.step + 1, now, self.step + 1)] if stepping else []
            if gpus:
                batch.append(gpu(now))
            if stepping:
                self.step += 1
            if batch:
                self.record(self.proc.process_batch(batch))
            if not unanswered:
                self.answers.update({(t, 0): now - 0.3 for t in answering})
            self.record(self.proc.tick(now, self.answers))

    def record(self, outputs: list) -> None:  # type: ignore[type-arg]
        self.opened += [(self.clock.now, t) for t in opened(outputs)]

    @property
    def unread(self) -> float:
        return self.proc.metrics.unread._value.get()


def test_a_broker_outage_is_not_a_hang_of_every_job() -> None:
    run = Run()
    run.seconds(30, stepping=True)
    run.seconds(int(OUTAGE), stepping=False, unanswered=True)
    assert run.opened == []
    assert run.unread == 1
    run.seconds(60, stepping=True)  # the broker is back, the job reports again
    assert run.opened == []
    assert run.unread == 0


def test_before_the_same_outage_read_as_answered_was_a_hang() -> None:
    """The control: the driver saying every fetch was answered is the old worker."""
    run = Run()
    run.seconds(30, stepping=True)
    run.seconds(int(OUTAGE), stepping=False)
    assert [t for _, t in run.opened] == ["hang"]


def test_records_that_come_while_unread_are_progress_on_the_stopped_clock() -> None:
    """The backlog comes before the other topics answer: its steps are stamped with the
    stopped clock, not 5 minutes later, and count as progress when the partition is read."""
    run = Run()
    run.seconds(30, stepping=True)
    run.seconds(int(OUTAGE), stepping=False, unanswered=True)
    run.seconds(5, stepping=True, unanswered=True)  # records, the other topics still silent
    assert run.unread == 1
    run.seconds(60, stepping=True)
    assert run.opened == []
    assert run.unread == 0


def test_a_job_that_hung_during_the_outage_is_found_on_seen_time() -> None:
    run = Run()
    run.seconds(30, stepping=True)
    run.seconds(20, stepping=False)  # hung 20 s before the broker went away
    run.seconds(int(OUTAGE), stepping=False, unanswered=True)
    assert run.opened == []
    back = run.clock.now
    run.seconds(90, stepping=False)
    assert [t for _, t in run.opened] == ["hang"]
    found_after = run.opened[0][0] - back
    # 60 s limit (+ a few s of step deadline): 20 s seen before, ~10 s before unread
    assert 20 <= found_after <= 45, found_after


def test_a_stalled_publish_loses_sight_of_every_partition() -> None:
    run = Run()
    run.seconds(30, stepping=True)
    for _ in range(int(OUTAGE)):
        run.clock.now += 1.0
        run.proc.lose_sight(run.clock.now)  # the app's timer while its publish stalls
    assert run.unread == 1
    run.seconds(1, stepping=False)  # the publish went through: a tick before any record
    run.seconds(30, stepping=True)
    assert run.opened == []
    assert run.unread == 0


def test_a_rebalance_is_not_counted_until_the_new_assignment_is_heard() -> None:
    """The revocation loses sight; the new assignment's topics are not heard (aiokafka: no
    answer yet) for 20 s, longer than the job's limit would allow for with the outage
    before: nothing opens until a fetch is answered, then the job goes on unflagged.
    Before (review): a tick between the outage's end and the revocation marked it read,
    and the rebalance's seconds counted as the job's silence."""
    run = Run()
    run.seconds(30, stepping=True)
    run.proc.lose_sight(run.clock.now)  # on_revoked
    run.proc.assign([0])
    run.answers = {(t, 0): None for t in INPUTS}  # a new assignment: nothing answered yet
    run.seconds(70, stepping=False, unanswered=True)
    assert run.opened == [] and run.unread == 1
    run.seconds(30, stepping=True)
    assert run.opened == [] and run.unread == 0


def test_not_known_never_ends_an_outage_that_is_known() -> None:
    """After a rebalance the partition's leader is still down: its topics stay unanswered
    (None) for minutes. Before (review), "not known" read as answered and the outage was
    a hang again."""
    run = Run()
    run.seconds(30, stepping=True)
    run.seconds(60, stepping=False, unanswered=True)
    run.proc.lose_sight(run.clock.now)
    run.proc.assign([0])
    run.answers = {(t, 0): None for t in INPUTS}
    run.seconds(300, stepping=False, unanswered=True)
    assert run.opened == [] and run.unread == 1


def test_one_input_topic_unread_is_an_unread_partition() -> None:
    """The steps topic's partition 0 has no leader while the GPU topic's answers and its
    samples keep coming: the job's progress cannot be read, so its silence is not its
    own. Before (review), the freshest topic spoke for the partition."""
    run = Run()
    run.seconds(30, stepping=True, gpus=True)
    gpu_only = tuple(t for t in INPUTS if t != TOPICS.steps)
    run.seconds(300, stepping=False, answering=gpu_only, gpus=True)
    assert run.opened == [] and run.unread == 1
    run.seconds(30, stepping=True, gpus=True)
    assert run.opened == [] and run.unread == 0


def test_a_paused_worker_is_not_a_hang() -> None:
    """The worker itself stopped 90 s (a frozen VM, a SIGSTOP): its timer sees the gap
    and loses sight from the last tick (the app's tick does this); the first answer
    after it ends the pause."""
    run = Run()
    run.seconds(30, stepping=True)
    last = run.clock.now
    run.clock.now += 90.0
    run.proc.lose_sight(last)
    run.seconds(1, stepping=False)
    run.seconds(20, stepping=True)
    assert run.opened == [] and run.unread == 0


def test_the_gate_counts_a_jobs_quiet_on_seen_time() -> None:
    """A full partition (one job at most). Job j hangs 30 s before a 2-hour outage; after
    it, a new job's records arrive. Before (review), the gate measured j's quiet on the
    worker's clock (2 h > its hour), let j go for the newcomer, and j's hang, 30 s from
    its limit on seen time, was never reported."""
    run = Run(AdmissionConfig(max_jobs=1))
    run.seconds(30, stepping=True)
    run.seconds(30, stepping=False)
    run.seconds(7200, stepping=False, unanswered=True)
    assert run.opened == []
    for i in range(60):
        run.clock.now += 1.0
        now = run.clock.now
        recs = [
            StepRecord(job_id="k", rank=r, world_size=2, step=i, start=now - 1, end=now, host="h9")
            for r in range(2)
        ]
        msg = StepMessage(host="h9", ts=now, job_id="k", steps=recs)
        run.record(run.proc.process_batch([Record(TOPICS.steps, 0, 10_000 + i, b"k", encode(msg))]))
        run.answers.update({(t, 0): now - 0.3 for t in INPUTS})
        run.record(run.proc.tick(now, run.answers))
    assert [t for _, t in run.opened] == ["hang"]


def test_nothing_known_runs_the_checks_on_the_workers_clock() -> None:
    """A driver that cannot read its client passes None: the old behaviour."""
    run = Run()
    run.seconds(30, stepping=True)
    for _ in range(90):
        run.clock.now += 1.0
        run.record(run.proc.tick(run.clock.now, None))
    assert [t for _, t in run.opened] == ["hang"]


def test_seen_time_stands_still_while_unread_and_goes_on_after() -> None:
    s = Sight(0)
    assert not s.judge(105.0, [100.0, 96.0], since=0.0, after=10.0)  # heard 5 and 9 s ago
    assert s.judge(115.0, [114.0, 104.0], since=0.0, after=10.0)  # one topic 11 s ago
    assert s.clock(115.0) == s.clock(500.0) == 115.0
    assert s.judge(515.0, [514.0, 110.0], since=0.0, after=10.0)  # not every topic since
    assert not s.judge(516.0, [515.5, 515.0], since=0.0, after=10.0)  # heard after: read
    assert s.clock(516.0) == 115.0 and s.clock(517.0) == 116.0
    assert s.judge(600.0, [float("-inf")], since=580.0, after=10.0)  # assigned 20 s ago
    assert not s.judge(601.0, None, since=580.0, after=10.0)  # nothing known: read
