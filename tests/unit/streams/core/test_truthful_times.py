"""A detection's timestamps say when things happened (an audit against the simulator's truth).

Each case failed before: a hang resolved 59 s before it opened (a transport outage), a
"job ended" resolution stamped at whatever tick came next (10 minutes late in a replay),
and a requeue under the same job id right after ``job_end`` ignored for 5 minutes.
"""

from __future__ import annotations

import pytest

from stepwatch.contract import DetectionMessage, EventMessage, EventType, Message, StepMessage
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import Engine

pytestmark = pytest.mark.unit
BASE = {"nodes": 2, "gpus_per_node": 4, "nics_per_node": 4}
SLOW = Fault(FaultKind.SLOW_GPU, rank=5, start_step=40, severity=0.3)


def _replay(msgs: list[Message], end: float = 5.0) -> list[DetectionMessage]:
    """As ``stepwatch replay``: event time, a tick each second, a last tick ``end`` later."""
    engine, out, last, now = Engine(), [], 0.0, 0.0
    for m in msgs:
        now = max(now, m.ts)
        out += engine.process(m)
        if now - last >= 1.0:
            last = now
            out += engine.tick(now)
    return out + engine.tick(now + end)


def _steps(msgs: list[Message]) -> list[float]:
    return [r.start for m in msgs if isinstance(m, StepMessage) for r in m.steps]


def test_a_job_ended_resolution_is_stamped_at_the_jobs_end():
    job = list(simulate(Scenario(steps=100, faults=(SLOW,), **BASE)))
    (end,) = [m for m in job if isinstance(m, EventMessage) and m.type == EventType.JOB_END]
    later = max(m.ts for m in job) + 600  # the next job's messages come 10 minutes later
    other = Scenario(job_id="job-2", hosts=("nodeX000",), nodes=1, steps=20, start_ts=later)
    found = _replay(sorted(job + list(simulate(other)), key=lambda m: m.ts))
    (resolved,) = [d for d in found if d.job_id == job[0].job_id and d.state == "resolved"]
    assert resolved.evidence["resolved_because"] == "job ended"
    assert resolved.ts == pytest.approx(end.ts, abs=0.01)  # before: the next tick


def test_a_requeue_under_the_same_job_id_after_its_end_is_watched_at_once():
    first = list(simulate(Scenario(steps=100, faults=(SLOW,), **BASE)))
    again = Scenario(
        steps=300,
        first_step=80,
        incarnation=1,
        start_ts=max(_steps(first)) + 20,
        faults=(Fault(FaultKind.SLOW_GPU, rank=5, start_step=80, severity=0.3),),
        **BASE,
    )
    second = list(simulate(again))
    began = min(_steps(second))
    found = _replay(
        sorted([m for m in first if m.ts < again.start_ts] + second, key=lambda m: m.ts)
    )
    opens = [d for d in found if d.state == "open" and d.type == "straggler"]
    assert [d.rank for d in opens] == [5, 5]
    assert opens[1].ts - began < 60  # before: 5 minutes (job_end_grace_seconds) later
    assert opens[1].first_step is not None and opens[1].first_step < 100  # before: 284


def test_a_hang_opened_during_a_transport_outage_is_not_resolved_before_it_opened():
    """Every message stamped in [80 s, 160 s) arrives at 160 s; the worker ticks on its own
    clock meanwhile, so the job looks hung; the backlog's first record resolves it."""
    msgs = list(simulate(Scenario(steps=200, **BASE)))
    t0 = min(m.ts for m in msgs)

    def arrival(m: Message) -> float:
        t = m.ts - t0
        return t0 + (160 + (t - 80) * 0.01 if 80 <= t < 160 else t) + 0.05

    engine, found, ticked = Engine(), [], 0.0
    for m in sorted(msgs, key=arrival):
        at = arrival(m)
        while ticked + 1.0 < at:
            ticked = ticked + 1.0 if ticked else at
            found += engine.tick(ticked)
        found += engine.process(m, at)
    hang = [d for d in found if d.type == "hang"]
    assert [d.state for d in hang] == ["open", "resolved"]
    assert hang[1].ts >= hang[0].ts  # before: 59 s before it opened
