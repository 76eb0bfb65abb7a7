"""Hangs, missing ranks and fatal GPU errors."""

from __future__ import annotations

from stepwatch.contract import EventType
from stepwatch.settings import Settings
from stepwatch.streams.core import DetectConfig, Engine
from tests.support.detect_synth import (
    Job,
    drive,
    event,
    gpu_message,
    interleave,
    opened,
    shifted,
)


def _last_end(messages: list) -> float:
    return max(r.end for m in messages for r in m.steps)


def test_no_progress_past_the_limit_is_a_hang_and_progress_resolves_it() -> None:
    job = Job(world=16, steps=40)
    messages = job.messages()
    early, late = messages[: 2 * 30], messages[2 * 30 :]
    engine = Engine()
    silent_from = _last_end(early)
    found = drive(engine, early, until=silent_from + 59)
    assert opened(found) == []  # 60 s is the default minimum
    found = drive(engine, [], until=silent_from + 62)
    hangs = opened(found, "hang")
    assert len(hangs) == 1 and hangs[0].rank is None and hangs[0].step == 29
    assert hangs[0].evidence["limit_s"] == 60.0
    assert engine.stats()[0].hung
    # the job moves again (its later steps, shifted after the pause)
    resumed = shifted(late, 70.0)
    found = drive(engine, resumed)
    assert [(d.type, d.state) for d in found if d.type == "hang"] == [("hang", "resolved")]
    assert not engine.stats()[0].hung
    assert engine.stats()[0].badput_seconds["hang"] > 60


def test_hang_limit_comes_from_settings() -> None:
    cfg = DetectConfig.from_settings(
        Settings.load(env={}, hang_min_seconds=20.0, hang_step_multiple=5.0)
    )
    job = Job(world=8, steps=30)
    messages = job.messages()
    found = drive(Engine(cfg), messages, until=_last_end(messages) + 21)
    assert [d.type for d in opened(found)] == ["hang"]


def test_crashed_rank_is_named_rank_missing() -> None:
    job = Job(world=16, steps=40, stop_at=30, crashed=11)  # rank 11 never finished step 29
    messages = job.messages()
    found = drive(Engine(), messages, until=_last_end(messages) + 61)
    missing = opened(found)
    assert [(d.type, d.rank) for d in missing] == [("rank_missing", 11)]
    d = missing[0]
    assert d.evidence["rank_last_step"] == 28 and d.evidence["last_step"] == 29
    assert d.host == "h001" and d.evidence["how"] == "behind"


def test_idle_gpu_names_the_dead_rank_when_no_step_is_behind() -> None:
    job = Job(world=16, steps=40, stop_at=30)
    messages = job.messages()
    t_stop = _last_end(messages)
    samples = []
    for k in range(-20, 70):  # rank 6's GPU idles after the stop, its peers spin in NCCL
        t = t_stop + k
        dead = {6: {"util_gpu_pct": 0.0, "power_w": 70.0}} if k > 0 else {}
        samples += [gpu_message("h000", t, dead), gpu_message("h001", t)]
    found = drive(Engine(), interleave(messages, samples), until=t_stop + 65)
    assert [(d.type, d.rank, d.evidence.get("how")) for d in opened(found)] == [
        ("rank_missing", 6, "idle_gpu")
    ]


def test_fatal_xid_opens_rank_missing_at_once_as_hardware() -> None:
    job = Job(world=16, steps=40, stop_at=30, crashed=3)
    messages = job.messages()
    t = _last_end(messages[:-2])
    xid = event(
        EventType.XID,
        "h000",
        t + 0.1,
        job_id=job.job_id,
        gpu=3,
        code=79,
        detail="GPU has fallen off the bus.",
    )
    found = drive(Engine(), interleave(messages, [xid]), until=t + 90)
    missing = opened(found)
    assert [(d.type, d.rank, d.cause, d.fault) for d in missing] == [
        ("rank_missing", 3, "hardware", "system")
    ]
    assert missing[0].ts == xid.ts  # not after the hang limit


def test_rank_absent_while_its_peers_progress() -> None:
    job = Job(world=16, steps=40)
    messages = job.messages()
    for m in messages:  # rank 12's agent stops sending from step 20 on
        m.steps[:] = [r for r in m.steps if not (r.rank == 12 and r.step >= 20)]
    engine = Engine()
    found = []
    for m in messages:
        found += engine.process(m)
        if m.host == "h001":  # both hosts sent this step; its deadline passes without rank 12
            found += engine.tick(m.ts + 5.1)
    missing = opened(found)
    assert [(d.type, d.rank, d.evidence["how"]) for d in missing] == [
        ("rank_missing", 12, "absent")
    ]


def test_restart_from_a_checkpoint_resolves_the_hang() -> None:
    job = Job(world=8, steps=30)
    first = job.messages()
    engine = Engine()
    stop = _last_end(first)
    found = drive(engine, first, until=stop + 70)
    assert [d.type for d in opened(found)] == ["hang"]
    shift = 120.0  # the scheduler restarts it from the checkpoint at step 20
    again = shifted([m for m in Job(world=8, steps=30).messages() if m.steps[0].step >= 20], shift)
    found = drive(engine, again)
    assert [(d.type, d.state, d.evidence["resolved_because"]) for d in found] == [
        ("hang", "resolved", "restarted")
    ]
    s = engine.stats()[0]
    assert not s.hung and s.badput_seconds["restart"] > 100
    assert s.badput_seconds["wasted_progress"] > 5


def test_a_checkpoint_event_from_the_sdk_raises_the_hang_limit() -> None:
    """``sw.checkpoint("save")`` sends its length as ``duration_s``; the core read only
    ``seconds`` (the simulator's name), so a real job that saves a 70 s checkpoint on
    every rank between steps (no step holds the pause) was called hung at every save,
    not only the first. The SDK's own event, from the job's host, now counts."""
    from stepwatch.contract import EventMessage
    from stepwatch.sdk.events import checkpoint_event
    from stepwatch.sdk.identity import Identity

    job = Job(world=8, steps=80)
    messages = job.messages()
    before = [m for m in messages if m.steps[0].step < 40]
    saved_at, pause = _last_end(before), 70.0
    after = shifted([m for m in messages if m.steps[0].step >= 40], pause)  # 70 s later
    sdk = checkpoint_event(Identity(job_id=job.job_id, host="h000"), False, pause, saved_at, 40)
    ckpt = EventMessage(
        host="h000",
        ts=saved_at + pause,
        type=sdk.type,
        job_id=job.job_id,
        rank=0,
        detail=sdk.detail,
        attrs=sdk.attrs,
    )
    engine = Engine()
    drive(engine, [*before, ckpt, *after])
    assert engine.jobs[job.job_id].longest_pause == pause
    # the next 70 s save is no hang: the limit is 60 s plus the 70 s seen
    found = drive(engine, [], until=_last_end(after) + pause + 5)
    assert opened(found, "hang") == []
    found = drive(engine, [], until=_last_end(after) + 135.0)
    assert [d.evidence["limit_s"] for d in opened(found, "hang")] == [130.0]


def _sdk_event(job: Job, kind: str, at: float, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    """The SDK's own checkpoint events (``sw.checkpoint``) as the agent forwards them."""
    from stepwatch.contract import EventMessage
    from stepwatch.sdk.events import checkpoint_begin_event, checkpoint_event
    from stepwatch.sdk.identity import Identity

    who = Identity(job_id=job.job_id, host="h000")
    sdk = (
        checkpoint_begin_event(who, False, at, 40)
        if kind == "begin"
        else checkpoint_event(who, False, seconds, at - seconds, 40)
    )
    return EventMessage(
        host="h000",
        ts=at,
        type=sdk.type,
        job_id=job.job_id,
        rank=0,
        detail=sdk.detail,
        attrs=sdk.attrs,
    )


def test_a_first_long_checkpoint_that_began_is_no_hang() -> None:
    """The first save of a job (5 minutes, between steps): before, the core knew of it
    only from its end, so the job was called hung a minute in (and JobHang requeues).
    ``sw.checkpoint`` now says when a save begins: the limit allows for it until the job
    steps again."""
    job = Job(world=8, steps=80)
    messages = job.messages()
    before = [m for m in messages if m.steps[0].step < 40]
    began, pause = _last_end(before) + 0.01, 300.0
    after = shifted([m for m in messages if m.steps[0].step >= 40], pause)
    engine = Engine()
    found = drive(engine, [*before, _sdk_event(job, "begin", began)], until=began + pause - 1)
    assert opened(found, "hang") == []
    found = drive(engine, [_sdk_event(job, "save", began + pause, pause), *after])
    assert opened(found) == []
    # the save is over: a real hang afterwards has the limit the save taught (60 + 300 s)
    found = drive(engine, [], until=_last_end(after) + 365.0)
    assert [d.evidence["limit_s"] for d in opened(found, "hang")] == [360.0]


def test_without_its_begin_the_same_checkpoint_is_a_hang() -> None:
    """The control: the same 5-minute silence with no ``checkpoint_begin``."""
    job = Job(world=8, steps=80)
    before = [m for m in job.messages() if m.steps[0].step < 40]
    found = drive(Engine(), before, until=_last_end(before) + 299.0)
    assert [d.evidence["limit_s"] for d in opened(found, "hang")] == [60.0]


def test_a_checkpoint_that_never_ends_is_a_hang_after_the_longest_pause() -> None:
    """A save stuck on its storage: found once ``hang_max_pause_seconds`` (30 min) is out."""
    job = Job(world=8, steps=80)
    before = [m for m in job.messages() if m.steps[0].step < 40]
    began = _last_end(before) + 0.01
    engine = Engine()
    found = drive(engine, [*before, _sdk_event(job, "begin", began)], until=began + 1850.0)
    assert opened(found, "hang") == []
    found = drive(engine, [], until=began + 1865.0)
    assert [d.evidence["limit_s"] for d in opened(found, "hang")] == [1860.0]


def test_a_checkpoint_the_job_steps_through_gives_no_more_time() -> None:
    """An asynchronous save (training goes on while it writes): once the job steps after
    the begin, a hang has the usual limit."""
    job = Job(world=8, steps=60)
    messages = job.messages()
    during = [m for m in messages if m.steps[0].step >= 40]
    before = [m for m in messages if m.steps[0].step < 40]
    begin = _sdk_event(job, "begin", _last_end(before) + 0.01)
    engine = Engine()
    drive(engine, [*before, begin, *during])
    found = drive(engine, [], until=_last_end(during) + 65.0)
    assert [d.evidence["limit_s"] for d in opened(found, "hang")] == [60.0]
