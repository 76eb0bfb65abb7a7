"""What one worker's detection cores may hold, as an attacker would try it.

Before: a ``job_start`` event's ``world_size`` was not bounded at all (one
message of ~100 bytes claiming 2^20 ranks made the core allocate ~1.9 GiB),
the core kept any number of jobs (20 step records of 20 new job ids at the
allowed 65,536 ranks: 2.4 GiB) and host windows, and a flood of 4,097 new job
ids evicted a real job from the admission gate, after which a foreign
``job_end`` closed its hang and a step of 10^9 passed.
"""

from __future__ import annotations

import msgspec
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
    encode,
)
from stepwatch.settings import Settings
from stepwatch.streams.worker.admission import AdmissionConfig
from stepwatch.streams.worker.app import default_engine_factory
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Record, StreamProcessor

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def steps(
    job: str, step: int, world: int = 2, host: str = "h1", ranks: int = 2, t: float | None = None
) -> StepMessage:
    s = T0 + step if t is None else t
    return StepMessage(
        host=host,
        ts=s + 1,
        job_id=job,
        steps=[
            StepRecord(job_id=job, rank=r, world_size=world, step=step, start=s, end=s + 0.9)
            for r in range(min(ranks, world))
        ],
    )


def event(kind: EventType, job: str, ts: float, host: str = "h1", **attrs: int) -> EventMessage:
    return EventMessage(host=host, ts=ts, type=kind, job_id=job, attrs=dict(attrs))


def gpu(host: str, ts: float) -> GpuMessage:
    return GpuMessage(host=host, ts=ts, gpus=[GpuReading(index=0, sm_clock_mhz=1400.0)])


class Worker:
    """A stream processor fed message by message; the dead letters' reasons come back."""

    def __init__(self, clock: Clock, admission: AdmissionConfig | None = None) -> None:
        self.topics = Topics("t")
        self.proc = StreamProcessor(
            self.topics,
            default_engine_factory(Settings.load(env={})),
            worker="w",
            clock=clock,
            admission=admission,
        )
        self.offset = 0

    def send(self, m: Message, partition: int = 0) -> list[str]:
        topic = {
            StepMessage: self.topics.steps,
            GpuMessage: self.topics.gpu,
            EventMessage: self.topics.events,
        }[type(m)]
        self.offset += 1
        out = self.proc.process_batch([Record(topic, partition, self.offset, b"k", encode(m))])
        return [decode_dead_letter(o.value).reason for o in out if o.topic == self.topics.dlq]

    def engine(self, partition: int = 0):  # the core, as the worker holds it
        return self.proc.states[partition].engine


def test_a_job_start_claiming_a_million_ranks_is_refused_and_allocates_nothing() -> None:
    w = Worker(Clock(T0 + 10))
    assert w.send(event(EventType.JOB_START, "evil", T0, world_size=1 << 20)) == ["world_size"]
    assert w.engine().jobs == {}
    # a real job's start of a plausible size still makes the core keep its job
    assert w.send(event(EventType.JOB_START, "real", T0, world_size=16)) == []
    assert list(w.engine().jobs) == ["real"]


def test_a_flood_of_new_job_ids_does_not_push_a_real_jobs_state_out() -> None:
    clock = Clock(T0 + 100)
    w = Worker(clock, AdmissionConfig(max_jobs=50))
    for s in range(60):
        assert w.send(steps("j", s)) == []
    refused = [r for i in range(80) for r in w.send(steps(f"flood{i}", 1, host="evil"))]
    assert refused.count("capacity") == 80 - 49  # the real job keeps its place
    assert len(w.engine().jobs) == 50
    # the real job's checks still hold: a foreign job_end, a step of 10^9
    assert w.send(event(EventType.JOB_END, "j", T0 + 61, host="evil")) == ["foreign_lifecycle"]
    assert w.send(steps("j", 10**9, t=T0 + 61)) == ["step_jump"]
    assert w.send(steps("j", 60)) == []


def test_the_rank_budget_bounds_the_core_and_a_quiet_job_gives_its_place_up() -> None:
    clock = Clock(T0 + 10)
    w = Worker(clock, AdmissionConfig(max_ranks=100_000, job_idle_seconds=600))
    assert w.send(steps("big1", 1, world=60000)) == []
    assert w.send(steps("big2", 1, world=60000)) == ["capacity"]
    assert w.send(event(EventType.JOB_START, "big3", T0 + 2, world_size=60000)) == ["capacity"]
    assert list(w.engine().jobs) == ["big1"] and w.proc.capacity.ranks == 60000
    # a job may not grow past the budget either (its own host resizing it)
    assert w.send(steps("small", 1, world=30000)) == []
    assert w.send(steps("small", 2, world=45000)) == ["capacity"]
    assert w.proc.capacity.ranks == 90000
    clock.now = T0 + 1000  # both quiet for longer than their idle time: their places free
    assert w.send(steps("big2", 990, world=60000)) == []
    assert w.proc.capacity.ranks == 60000 + 30000  # one quiet job made room (the oldest)


def test_a_flood_of_host_names_is_bounded_and_known_hosts_go_on() -> None:
    clock = Clock(T0 + 10)
    w = Worker(clock, AdmissionConfig(max_hosts=10, host_idle_seconds=300))
    for i in range(10):
        assert w.send(gpu(f"real{i}", T0 + 1)) == []
    refused = [r for i in range(30) for r in w.send(gpu(f"evil{i}", T0 + 2))]
    assert refused == ["capacity"] * 30
    assert sorted(w.engine().windows) == sorted(f"real{i}" for i in range(10))
    assert w.send(gpu("real3", T0 + 3)) == []  # a known host's samples go on
    clock.now = T0 + 400  # every host quiet for longer than its idle time but real3
    assert w.send(gpu("real3", T0 + 399)) == []
    assert w.send(gpu("new", T0 + 399)) == []  # a quiet host gave its place up
    assert w.proc.capacity.hosts == 10


def test_a_partition_taken_away_gives_its_places_back() -> None:
    w = Worker(Clock(T0 + 10))
    w.proc.assign([0, 1])
    assert w.send(steps("a", 1, world=64), partition=0) == []
    assert w.send(steps("b", 1, world=32), partition=1) == []
    assert w.send(gpu("h9", T0 + 1), partition=1) == []
    assert (w.proc.capacity.ranks, w.proc.capacity.hosts) == (96, 1)
    w.proc.assign([0])
    assert (w.proc.capacity.ranks, w.proc.capacity.hosts) == (64, 0)


def test_a_claim_no_ranks_back_gives_its_place_up_to_a_real_job() -> None:
    # Before this, two messages claiming 65,536 + 30,000 ranks (one rank reporting each)
    # held the worker's whole budget for an hour: every real new job was refused.
    clock = Clock(T0 + 10)
    w = Worker(clock, AdmissionConfig(max_ranks=65536 + 30000, confirm_seconds=120))
    assert w.send(steps("claim1", 1, world=65536, ranks=1, host="evil")) == []
    assert w.send(steps("claim2", 1, world=30000, ranks=1, host="evil")) == []
    real = steps("real", 1, world=16, ranks=16)
    assert w.send(real) == ["capacity"]  # the claims are young: no room yet
    clock.now = T0 + 200  # older than confirm_seconds, still fewer than half their ranks
    assert w.send(steps("real", 150, world=16, ranks=16, t=T0 + 190)) == []
    assert sorted(w.engine().jobs) == ["claim2", "real"]  # the oldest claim went, core too
    assert w.proc.capacity.ranks == 30000 + 16


def test_a_job_whose_ranks_reported_is_never_let_go_for_a_new_one() -> None:
    clock = Clock(T0 + 10)
    w = Worker(clock, AdmissionConfig(max_ranks=100, confirm_seconds=120))
    assert w.send(steps("a", 1, world=64, ranks=64)) == []
    clock.now = T0 + 500
    assert w.send(steps("a", 480, world=64, ranks=64, t=T0 + 490)) == []
    assert w.send(steps("b", 1, world=64, ranks=64, t=T0 + 495)) == ["capacity"]
    assert list(w.engine().jobs) == ["a"]


def test_a_message_mixing_world_sizes_of_one_job_is_counted_as_the_core_builds_it() -> None:
    # before: [rank 0 of 65,536, rank 0 of 1] grew the gate's job to 65,536 and shrank it
    # to 1, while the core (one size a message: the first) built it at 65,536; 8 such
    # messages of 286 bytes: the gate counted 8 ranks, the core held 524,288 (~1 GiB)
    w = Worker(Clock(T0 + 10))
    for i in range(8):
        big, small = steps(f"mix{i}", 1, world=65536, ranks=1), steps(f"mix{i}", 1, world=1)
        mixed = msgspec.structs.replace(big, steps=[*big.steps, *small.steps])
        w.send(mixed)
    held = sum(j.world_size for j in w.engine().jobs.values())
    assert held == w.proc.capacity.ranks <= 131072


def test_a_flood_of_host_names_gives_way_to_the_hosts_of_a_job() -> None:
    # before: 16,384 made-up host names (~1.6 MB) held every host place for 15 minutes,
    # and a new node's samples and XID events were refused all that time
    clock = Clock(T0 + 10)
    w = Worker(clock, AdmissionConfig(max_hosts=10))
    for i in range(10):
        assert w.send(gpu(f"evil{i}", T0 + 1)) == []
    assert w.send(gpu("node07", T0 + 2)) == ["capacity"]  # no step of it yet: no room
    for s in range(1, 4):  # its job's step records: records of 3 steps make it the job's
        assert w.send(steps("real", s, world=8, ranks=8, host="node07")) == []
    assert w.send(gpu("node07", T0 + 5)) == []  # a made-up host gave way
    assert "node07" in w.engine().windows and "evil0" not in w.engine().windows
    assert len(w.engine().windows) == 10 and w.proc.capacity.hosts == 10
    assert w.send(gpu("evil99", T0 + 6)) == ["capacity"]  # made-up names still wait
