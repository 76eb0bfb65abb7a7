"""An event that names a job counts only from one of the job's hosts.

Before: only a ``job_end`` was judged. From a host that runs none of job j's
ranks, one ``checkpoint_save`` of 10^12 s hid j's hang for good, one XID 79
naming j's rank 0 opened ``rank_missing`` on j (placed on the sender), one
``exception`` opened ``user_error`` on j (its owner notified), and one
``job_start`` stamped 23 h back made j's goodput collapse (0.89 to 0.002, a
page). Each is now a dead letter with its reason; a host's own hardware or link
event goes on without the job it named. Driven through the real worker
processor (gate + detection core), and through the core alone (replay).
"""

from __future__ import annotations

import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    StepMessage,
    StepRecord,
    Topics,
    decode,
    encode,
)
from stepwatch.contract.records import DetectionMessage
from stepwatch.settings import Settings
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.worker.app import default_engine_factory
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Record, StreamProcessor

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
TOPICS = Topics("t")


def steps(step: int, host: str = "gpu-001") -> StepMessage:
    s = T0 + step
    return StepMessage(
        host=host,
        ts=s + 1,
        job_id="j",
        steps=[
            StepRecord(job_id="j", rank=r, world_size=2, step=step, start=s, end=s + 0.9, host=host)
            for r in (0, 1)
        ],
    )


def event(
    kind: EventType, host: str = "evil-node", ts: float = T0 + 61, **kw: object
) -> EventMessage:
    return EventMessage(host=host, ts=ts, type=kind, job_id="j", **kw)  # type: ignore[arg-type]


class Worker:
    """The worker's processor on a job ``j`` of 60 steps from ``gpu-001`` (both ranks)."""

    def __init__(self) -> None:
        self.clock = T0 + 61
        self.proc = StreamProcessor(
            TOPICS,
            default_engine_factory(Settings.load(env={})),
            worker="w",
            clock=lambda: self.clock,
        )
        self.detections: list[DetectionMessage] = []
        self.seen = self.feed(TOPICS.steps, *(steps(i) for i in range(60)))

    def feed(self, topic: str, *messages: object) -> list[tuple[str, ...]]:
        recs = [Record(topic, 0, i, b"j", encode(m)) for i, m in enumerate(messages)]  # type: ignore[arg-type]
        return self._read(self.proc.process_batch(recs))

    def idle(self, seconds: float) -> list[tuple[str, ...]]:
        """Nothing arrives for ``seconds``: the worker ticks every 5 s."""
        out: list[tuple[str, ...]] = []
        start = self.clock
        for k in range(5, int(seconds) + 1, 5):
            self.clock = start + k
            out += self._read(self.proc.tick(self.clock))
        return out

    def _read(self, outputs: list) -> list[tuple[str, ...]]:  # type: ignore[type-arg]
        out: list[tuple[str, ...]] = []
        for o in outputs:
            if o.topic == TOPICS.dlq:
                letter = decode_dead_letter(o.value)
                out.append(("dlq", letter.reason, letter.detail))
            elif o.topic == TOPICS.detections:
                d = decode(o.value)
                assert isinstance(d, DetectionMessage)
                self.detections.append(d)
                out.append((d.type, d.state, d.host))
        return out


def opened(seen: list[tuple[str, ...]]) -> list[tuple[str, str]]:
    return [(s[0], s[2]) for s in seen if s[0] != "dlq" and s[1] == "open"]


def letters(seen: list[tuple[str, ...]]) -> list[str]:
    return [s[1] for s in seen if s[0] == "dlq"]


def test_a_stopped_job_hangs_without_any_forged_event() -> None:
    """The reference the attacks below are measured against."""
    w = Worker()
    assert opened(w.idle(700)) == [("hang", "stepwatch")]


def test_a_foreign_checkpoint_save_does_not_hide_the_hang() -> None:
    w = Worker()
    seen = w.feed(TOPICS.events, event(EventType.CHECKPOINT_SAVE, attrs={"seconds": 1e12}))
    assert letters(seen) == ["foreign_job"]
    assert "evil-node" in seen[0][2] and "checkpoint_save" in seen[0][2]
    assert opened(w.idle(700)) == [("hang", "stepwatch")]


def test_the_jobs_own_checkpoint_save_extends_the_limit_by_half_an_hour_at_most() -> None:
    """From one of the job's hosts the event is taken, but its seconds count up to
    ``hang_max_pause_seconds`` (half an hour): the hang is found then, not never."""
    w = Worker()
    seen = w.feed(
        TOPICS.events, event(EventType.CHECKPOINT_SAVE, host="gpu-001", attrs={"seconds": 1e12})
    )
    assert letters(seen) == []
    assert opened(w.idle(1800)) == []  # the pause it claims is taken, up to 1800 s
    assert opened(w.idle(600)) == [("hang", "stepwatch")]
    hang = [d for d in w.detections if d.type == "hang" and d.state == "open"]
    assert hang[0].evidence["longest_pause_s"] == 1800.0  # what counted, not what was claimed


def test_a_foreign_xid_opens_nothing_on_the_job_and_is_kept_as_the_hosts_own() -> None:
    w = Worker()
    seen = w.feed(TOPICS.events, event(EventType.XID, rank=0, gpu=0, code=79, detail="forged"))
    assert letters(seen) == ["foreign_job"]
    assert seen[0][2].endswith("kept as the host's own")
    assert opened(seen) == []
    assert opened(w.idle(700)) == [("hang", "stepwatch")]  # not hidden by a rank_missing


def test_the_jobs_own_xid_still_opens_rank_missing() -> None:
    w = Worker()
    seen = w.feed(
        TOPICS.events, event(EventType.XID, host="gpu-001", rank=0, gpu=0, code=79, detail="xid")
    )
    assert letters(seen) == []
    assert opened(seen) == [("rank_missing", "gpu-001")]


def test_a_foreign_exception_is_refused() -> None:
    w = Worker()
    seen = w.feed(TOPICS.events, event(EventType.EXCEPTION, rank=0, detail="forged"))
    assert letters(seen) == ["foreign_job"]
    assert opened(seen) == []


@pytest.mark.parametrize("kind", [EventType.RESTART, EventType.CHECKPOINT_LOAD])
def test_events_the_core_reads_nothing_from_pass_unjudged(kind: EventType) -> None:
    """A requeue onto new nodes sends them from hosts the job does not have yet: judging
    them would only make dead letters of real events."""
    w = Worker()
    assert letters(w.feed(TOPICS.events, event(kind, host="spare-node", rank=0))) == []


def test_a_foreign_job_start_of_a_running_job_is_refused() -> None:
    w = Worker()
    forged = EventMessage(
        host="evil-node",
        ts=T0 + 61 - 23 * 3600,
        type=EventType.JOB_START,
        job_id="j",
        attrs={"world_size": 2},
    )
    seen = w.feed(TOPICS.events, forged)
    assert letters(seen) == ["foreign_lifecycle"]
    (stats,) = [s for s in w.proc.stats() if s.job_id == "j"]
    assert stats.goodput_ratio is None or stats.goodput_ratio > 0.5


def test_a_job_start_sent_before_the_job_was_known_counts_only_from_its_hosts() -> None:
    """Before: one ``job_start`` stamped 23 h back from a host that never runs the job,
    sent before the job's own records, was taken as the job's start: its goodput
    went from 0.90 to 0.003 (a page). The gate cannot judge it then (no host of the
    job is known yet); the core counts it only once its host runs the job's ranks."""

    def goodput(forged: bool) -> float | None:
        eng = Engine(DetectConfig())
        if forged:
            eng.process(event(EventType.JOB_START, ts=T0 - 23 * 3600, attrs={"world_size": 2}))
        own = event(EventType.JOB_START, host="gpu-001", ts=T0 - 0.2, attrs={"world_size": 2})
        eng.process(own)
        for i in range(120):
            eng.process(steps(i))
        (stats,) = [s for s in eng.stats() if s.job_id == "j"]
        return stats.goodput_ratio

    honest = goodput(forged=False)
    assert honest is not None and honest > 0.8
    assert goodput(forged=True) == honest


# ------------------------------------------------------------------ the core alone (replay)
def core() -> Engine:
    eng = Engine(DetectConfig())
    for i in range(60):
        eng.process(steps(i))
    return eng


def test_the_core_takes_no_job_claim_from_a_host_that_runs_none_of_its_ranks() -> None:
    eng = core()
    xid = event(EventType.XID, rank=0, gpu=0, code=79, detail="forged")
    assert eng.process(xid) == []
    assert eng.process(event(EventType.EXCEPTION, rank=0, detail="forged")) == []
    eng.process(event(EventType.CHECKPOINT_SAVE, attrs={"seconds": 1e12}))
    assert eng.jobs["j"].longest_pause < 1e12


def test_the_core_places_an_xid_on_the_rank_of_the_sending_host_only() -> None:
    """A host of the job naming a rank that runs on another host: the GPU it names on
    its own host is the one lost, not the other host's rank."""
    eng = Engine(DetectConfig())
    for i in range(30):
        s = T0 + i
        for rank, host in ((0, "gpu-001"), (1, "gpu-002")):
            rec = StepRecord(
                job_id="j", rank=rank, world_size=2, step=i, start=s, end=s + 0.9, host=host
            )
            eng.process(StepMessage(host=host, ts=s + 1, job_id="j", steps=[rec]))
    xid = event(EventType.XID, host="gpu-002", rank=0, gpu=0, code=79, detail="xid")
    found = eng.process(xid)
    assert [(d.type, d.rank, d.host) for d in found] == [("rank_missing", 1, "gpu-002")]
