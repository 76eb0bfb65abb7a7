"""Job and peer-group slowdowns against the job's own history."""

from __future__ import annotations

from stepwatch.contract import Message
from stepwatch.streams.core import Engine
from stepwatch.streams.core.slowdown import SlowRun
from tests.support.detect_synth import (
    Job,
    drive,
    gpu_message,
    interleave,
    num,
    opened,
    port_message,
)


def test_whole_job_slowdown_is_a_job_slowdown_not_stragglers() -> None:
    job = Job(world=16, steps=90, job_factor=lambda s: 1.15 if s >= 50 else 1.0)
    found = drive(Engine(), job.messages())
    assert [d.type for d in opened(found)] == ["job_slowdown"]
    d = opened(found)[0]
    assert d.rank is None and d.group == "" and d.host == "stepwatch"
    assert 0.10 < (d.score or 0) < 0.20
    # about 1 s steps: open once the slow run lasted slowdown_min_seconds (10 s), and in
    # k of the last n steps
    assert 8 <= (d.step or 0) - 50 <= 10
    assert num(d, "baseline_step_s") < num(d, "current_step_s")
    assert num(d, "delta_compute_s") > 0.05


def test_a_few_seconds_of_a_slower_job_is_not_a_job_slowdown() -> None:
    """A loaded machine slows every rank of a fast job alike for a few seconds: not an
    incident. The same dip held past slowdown_min_seconds is one."""
    short = Job(world=16, steps=90, job_factor=lambda s: 1.3 if 50 <= s < 56 else 1.0)
    assert opened(drive(Engine(), short.messages())) == []
    held = Job(world=16, steps=90, job_factor=lambda s: 1.3 if 50 <= s < 66 else 1.0)
    assert [d.type for d in opened(drive(Engine(), held.messages()))] == ["job_slowdown"]


def test_one_straggler_is_not_also_a_job_slowdown() -> None:
    job = Job(world=16, steps=90, slow={4: (50, 1.25)})
    assert [d.type for d in opened(drive(Engine(), job.messages()))] == ["straggler"]


def test_a_whole_pipeline_stage_getting_slower_names_the_group() -> None:
    job = Job(world=32, steps=90, stages=4, group_factor={"pp1": (50, 1.2)})
    found = opened(drive(Engine(), job.messages()))
    assert [(d.type, d.group) for d in found] == [("job_slowdown", "pp1")]


def test_slower_collectives_with_a_congested_nic_blame_the_network() -> None:
    job = Job(world=16, steps=90)
    messages = job.messages()
    for m in messages:  # the all-reduce itself takes 0.12 s longer from step 50 on
        if m.steps[0].step >= 50:
            m.steps[:] = [_later(r, 0.12) for r in m.steps]
    _shift_after(messages, 50, 0.12)
    samples: list[Message] = []
    t = messages[0].ts
    cnp = 0
    while t < messages[-1].ts + 2:
        for h in job.hosts():
            congested = h == "h001" and t > messages[0].ts + 50
            cnp += 2000 if congested else 0
            counters: dict[int, dict[str, object]] = {
                2: {"np_cnp_sent_total": 10 + cnp, "xmit_wait_total": 1000 + 500 * cnp}
            }
            samples += [gpu_message(h, t), port_message(h, t, counters if h == "h001" else None)]
        t += 1.0
    every = opened(drive(Engine(), interleave(messages, samples)))
    found = [d for d in every if not d.related]
    assert [d.type for d in found] == ["job_slowdown"]
    # the port is also reported from its counters, as part of the same incident
    net = [d for d in every if d.type == "network_congestion"]
    assert [(d.host, d.device, d.related) for d in net] == [("h001", "mlx5_2", found[0].id)]
    assert found[0].cause == "network" and found[0].fault == "system"
    assert found[0].evidence["suspect_host"] == "h001"
    assert found[0].evidence["device"] == "mlx5_2"


def _later(r, dt):  # type: ignore[no-untyped-def]
    import msgspec

    ph = msgspec.structs.replace(r.phases, comm_wait=r.phases.comm_wait + dt)
    return msgspec.structs.replace(r, end=r.end + dt, phases=ph)


def _shift_after(messages, step, dt):  # type: ignore[no-untyped-def]
    """Every later step starts and ends ``dt`` later per slower step before it."""
    import msgspec

    for m in messages:
        s = m.steps[0].step
        if s > step:
            shift = dt * (s - step)
            m.steps[:] = [
                msgspec.structs.replace(r, start=r.start + shift, end=r.end + shift)
                for r in m.steps
            ]


def test_a_slow_run_outlasts_the_steps_a_qualifying_window_may_hold_back() -> None:
    """A bursty slowdown (two normal steps now and then, as a window of 6 of 8 flagged
    allows) is one run; three normal steps in a row end it."""
    run = SlowRun(gap=2)
    run.update(False, 9.0)  # a normal step: not a run
    assert run.seconds() == 0.0
    pattern = [True, True, True, False, False, True, True, True, False, False, True]
    for i, slow in enumerate(pattern):
        run.update(slow, 10.0 + i)
    assert run.seconds() == 11.0  # from the end of the step before the first slow one
    for i in range(3):
        run.update(False, 21.0 + i)
    assert run.seconds() == 0.0
    run.update(True, 30.0)
    assert run.seconds() == 7.0  # a new run, from the last step's end
