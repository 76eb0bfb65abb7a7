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

from stepwatch.contract import StepMessage, StepRecord, Topics, encode
from stepwatch.settings import Settings
from stepwatch.streams.worker.app import default_engine_factory
from stepwatch.streams.worker.processor import Record, StreamProcessor
from stepwatch.streams.worker.sight import Sight

pytestmark = pytest.mark.unit

TOPICS = Topics("t")
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


def opened(outputs: list) -> list[str]:  # type: ignore[type-arg]
    docs = [msgspec.json.decode(o.value) for o in outputs if o.topic == TOPICS.detections]
    return [d["type"] for d in docs if d["state"] == "open"]


class Run:
    """Drive the processor second by second: steps while the job runs, ticks always."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.proc = StreamProcessor(
            TOPICS, default_engine_factory(Settings.load(env={})), clock=self.clock
        )
        self.step = 0
        self.opened: list[tuple[float, str]] = []

    def seconds(self, n: int, *, stepping: bool, unanswered: bool = False) -> None:
        for _ in range(n):
            self.clock.now += 1.0
            if stepping:
                self.step += 1
                out = self.proc.process_batch([steps(self.step, self.clock.now, self.step)])
                self.opened += [(self.clock.now, t) for t in opened(out)]
            ages = {0: self.clock.now - self.answered} if unanswered else {0: 0.3}
            if not unanswered:
                self.answered = self.clock.now
            out = self.proc.tick(self.clock.now, ages)
            self.opened += [(self.clock.now, t) for t in opened(out)]

    answered = T0

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


def test_records_arriving_end_the_outage_before_the_next_tick() -> None:
    """The backlog comes before a tick says the broker answers: its steps are progress on
    seen time, not after 5 minutes of silence."""
    run = Run()
    run.seconds(30, stepping=True)
    run.seconds(int(OUTAGE), stepping=False, unanswered=True)
    run.seconds(60, stepping=True, unanswered=True)  # fetch ages stale, records come
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


def test_seen_time_stands_still_while_unread_and_goes_on_after() -> None:
    s = Sight(0)
    s.read(100.0)
    assert not s.judge(105.0, 20.0, after=10.0)  # a record 5 s ago: read
    assert not s.judge(109.0, 5.0, after=10.0)  # answered 5 s ago
    assert s.judge(115.0, 15.0, after=10.0)
    assert s.clock(115.0) == s.clock(500.0) == 115.0
    s.read(515.0)  # unread for 400 s
    assert s.clock(515.0) == 115.0 and s.clock(516.0) == 116.0
    assert not s.judge(517.0, None, after=10.0)  # not known: judged as answered
