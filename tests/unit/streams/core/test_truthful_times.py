"""A detection's timestamps say when things happened (an audit against the simulator's truth).

Each case failed before: a hang resolved 59 s before it opened (a transport outage), a
"job ended" resolution stamped at whatever tick came next (10 minutes late in a replay),
and a requeue under the same job id right after ``job_end`` ignored for 5 minutes.
"""

from __future__ import annotations

import msgspec
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


def _skewed(m: Message, host: str, by: float) -> Message:
    """``m`` as stamped by ``host`` whose clock is ``by`` seconds off."""
    if m.host != host:
        return m
    if isinstance(m, StepMessage):
        steps = [msgspec.structs.replace(r, start=r.start + by, end=r.end + by) for r in m.steps]
        return msgspec.structs.replace(m, ts=m.ts + by, steps=steps)
    return msgspec.structs.replace(m, ts=m.ts + by)


def _live(timeline: list[tuple[float, Message]], after: float = 400) -> list[DetectionMessage]:
    """Messages arriving at their (true) times, a tick each second, then ``after`` more."""
    engine, out, t = Engine(), [], 0.0
    for at, m in sorted(timeline, key=lambda p: p[0]):
        while t + 1.0 <= at:
            t = t + 1.0 if t else at
            out += engine.tick(t)
        out += engine.process(m, at)
    for k in range(1, int(after)):
        out += engine.tick(t + k)
    return out


def test_a_job_end_from_a_host_whose_clock_is_behind_resolves_at_the_jobs_end():
    """node0000 (60 s behind its peers) sends job_end: the straggler it resolves was
    stamped on that host's clock, 60 s before the job ended."""
    fault = Fault(FaultKind.SLOW_GPU, rank=9, start_step=100, severity=0.3)
    msgs = list(simulate(Scenario(steps=200, nodes=3, gpus_per_node=4, faults=(fault,))))
    (end,) = [m for m in msgs if isinstance(m, EventMessage) and m.type == EventType.JOB_END]
    assert end.host == "node0000"
    found = _live([(m.ts, _skewed(m, "node0000", -60.0)) for m in msgs], after=30)
    (resolved,) = [d for d in found if d.type == "straggler" and d.state == "resolved"]
    assert resolved.evidence["resolved_because"] == "job ended"
    assert resolved.ts == pytest.approx(end.ts, abs=1.0)  # before: 60 s early


@pytest.mark.parametrize("ahead", [7.0, 30.0])
def test_a_late_last_message_from_a_host_whose_clock_is_ahead_is_no_new_run(ahead: float):
    """node0001's clock is ahead and its last step message arrives 8.5 s after job_end
    (past the assembly deadline): its records start after the end on the sender's clock,
    but they are the old run's. Taken for a new run, they opened a false hang a minute
    later."""
    msgs = list(simulate(Scenario(steps=60, **BASE)))
    (end,) = [m for m in msgs if isinstance(m, EventMessage) and m.type == EventType.JOB_END]
    timeline = [(m.ts, _skewed(m, "node0001", ahead)) for m in msgs]
    last = max(
        i
        for i, (_, m) in enumerate(timeline)
        if isinstance(m, StepMessage) and m.host == "node0001"
    )
    timeline.append((end.ts + 8.5, timeline.pop(last)[1]))
    found = _live(timeline)
    assert [d for d in found if d.ts > end.ts - 1] == []
