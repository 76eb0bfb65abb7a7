"""A rank whose process died (``rank_exit``) and the exceptions its peers raise for it.

Modelled on a real two-node torchrun job (gloo) whose rank 2 was killed: its
peers raised ``RuntimeError: ... Connection closed by peer`` and the job was
reported as rank 1's ``user_error``; the node whose rank died was named nowhere.
"""

from __future__ import annotations

import pytest

from stepwatch.contract import EventMessage, EventType
from stepwatch.streams.core import Engine
from stepwatch.streams.core.exits import first_exits, is_peer_failure
from tests.support.detect_synth import T0, Job, drive, event, interleave, opened

pytestmark = pytest.mark.unit

GLOO = (
    "Got the following error when running the callback: RuntimeError: [/pytorch/third_party/"
    "gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:31616. This "
    "is typically caused by a remote worker crashing."
)
STOP = 30  # the job's last step
JOB = Job(world=16, steps=STOP)  # hosts h000 (ranks 0-7) and h001 (ranks 8-15)
END = T0 + STOP + 0.2  # about when the last steps ended


def exception(rank: int, t: float, message: str = GLOO, cls: str = "RuntimeError") -> EventMessage:
    host = JOB.host(rank)
    return event(
        EventType.EXCEPTION,
        host,
        t,
        job_id=JOB.job_id,
        rank=rank,
        detail=cls,
        attrs={"exception": f"builtins.{cls}", "message": message},
    )


def exit_(rank: int, t: float, host: str | None = None, **how: int) -> EventMessage:
    """``how``: the agent's ``signal`` or ``exit_code`` (none: it could not tell)."""
    return event(
        EventType.RANK_EXIT,
        host or JOB.host(rank),
        t,
        job_id=JOB.job_id,
        rank=rank,
        detail="process ended without job_end",
        attrs={"last_step": STOP - 1, **how},
    )


def job_end(t: float, code: int = 1, detail: str = "error: RuntimeError") -> EventMessage:
    return event(EventType.JOB_END, "h000", t, job_id=JOB.job_id, rank=0, code=code, detail=detail)


def run(extra: list[EventMessage], until: float = END + 10) -> list:  # type: ignore[type-arg]
    """The job, the events, then ticks past the exits' settling (3 s) to ``until``."""
    return drive(Engine(), interleave(JOB.messages(), extra), until=until)


def brief(found: list) -> list[tuple[object, ...]]:  # type: ignore[type-arg]
    return [(d.type, d.rank, d.host, d.fault) for d in opened(found)]


def test_a_killed_rank_is_named_not_its_peers_exception() -> None:
    """The rank that died is rank_missing on its own host; no user error (before: rank
    1's gloo error was the job's user_error)."""
    found = run([exit_(10, END + 1.0), exception(1, END + 1.01), job_end(END + 1.5)])
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]
    d = opened(found)[0]
    assert d.evidence["how"] == "exited"
    assert "Connection closed by peer" in str(d.evidence["peer_failure"])
    assert "ended without a job_end" in d.summary


def test_the_exit_arriving_after_the_peers_exception_is_still_named() -> None:
    engine = Engine()
    found = drive(engine, JOB.messages())
    found += engine.process(exception(1, END + 1.01))
    found += engine.tick(END + 6)
    assert brief(found) == []  # a peer's failure alone blames nobody
    found += engine.process(exit_(10, END + 1.0))  # another host's agent, later
    assert brief(found) == []  # named once the exits settled
    found += engine.tick(END + 8) + engine.tick(END + 10)
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]


def test_ranks_torn_down_after_the_first_exit_are_not_named() -> None:
    events = [exit_(10, END + 1.0), exit_(11, END + 1.2), exception(1, END + 1.01)]
    events += [exit_(0, END + 2.0), exit_(1, END + 2.0)]
    assert brief(run(events)) == [("rank_missing", 10, "h001", "unknown")]


def test_a_real_error_in_user_code_stays_a_user_error() -> None:
    """Rank 3 raises in its own code; the launcher then stops the others (exits after it)."""
    events = [exception(3, END + 1.0, "shapes (4,3) and (2,) not aligned", "ValueError")]
    events += [exit_(r, END + 1.2) for r in (8, 9)]
    events += [exception(1, END + 1.3), job_end(END + 1.5)]
    assert brief(run(events)) == [("user_error", 3, "h000", "user")]


def test_a_failed_job_end_after_a_peer_failure_is_no_user_error() -> None:
    assert brief(run([exception(1, END + 1.0), job_end(END + 1.5)])) == []


def test_an_exit_alone_opens_nothing() -> None:
    """Ranks other than 0 end without a job_end when a job ends well."""
    assert brief(run([exit_(10, END + 1.0)])) == []


def test_an_exit_from_a_host_that_does_not_run_the_rank_is_ignored() -> None:
    events = [exit_(10, END + 1.0, host="h000"), exception(1, END + 1.01)]
    assert brief(run(events)) == []


def test_a_hang_names_the_rank_that_exited() -> None:
    """NCCL peers block instead of raising: at the hang limit the exited rank is named."""
    found = run([exit_(10, END + 1.0)], until=END + 200)
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]
    assert opened(found)[0].evidence["how"] == "exited"


def test_a_job_stopped_whole_is_no_dead_rank_and_no_hang() -> None:
    """Cancelled or out of time: every rank's process ends together (a peer's error
    racing its own end). Nothing is named, and the job has ended: before, a job that
    sends no job_end was called hung a minute later (JobHang: requeue)."""
    events = [exit_(r, END + 1.0 + 0.001 * r) for r in range(16)]
    events.insert(2, exception(1, END + 1.0005))
    found = run(events, until=END + 300)
    assert brief(found) == []
    assert all(d.type != "hang" for d in found)


def test_without_every_exit_a_silent_job_is_still_hung() -> None:
    events = [exit_(r, END + 1.0) for r in range(15)]  # rank 15's host told nothing
    found = run(events, until=END + 300)
    assert [d.type for d in opened(found)] == ["hang"]


def test_peer_failure_patterns() -> None:
    assert is_peer_failure(exception(1, T0, GLOO))
    assert is_peer_failure(exception(1, T0, "NCCL communicator was aborted on rank 3."))
    assert is_peer_failure(exception(1, T0, "boom", "DistBackendError"))
    assert not is_peer_failure(exception(1, T0, "CUDA out of memory", "OutOfMemoryError"))
    assert not is_peer_failure(exception(1, T0, "list index out of range", "IndexError"))


def test_first_exits_are_the_earliest_and_those_with_it() -> None:
    hosts = ["a", "a", "b", "b", "c", "c"]
    assert first_exits({}, hosts) == []
    # other hosts within 50 ms: together (their clocks are compared through offsets)
    assert first_exits({4: 10.0, 2: 10.01, 0: 10.5}, hosts) == [2, 4]
    # one host's later exit came after (one clock); the same instant is together
    assert first_exits({2: 10.0, 3: 10.036, 0: 10.5}, hosts) == [2]
    assert first_exits({2: 10.0, 3: 10.0, 0: 10.5}, hosts) == [2, 3]
    assert first_exits({4: 10.0, 2: 10.01, 3: 10.03}, hosts) == [2, 4]


def test_a_node_mate_its_launcher_stopped_36_ms_later_is_not_named() -> None:
    """torchrun stops a dead rank's node mates within its 0.1 s monitor interval: in
    a real two-node job rank 3 ended 36 ms after the killed rank 2, and both were
    named (a CI run failed on it). One host's exits share its agent's clock."""
    events = [exit_(10, END + 1.0), exit_(11, END + 1.036), exception(1, END + 1.05)]
    events += [exit_(r, END + 2.0) for r in range(2)]
    assert brief(run(events)) == [("rank_missing", 10, "h001", "unknown")]


def test_an_end_before_the_exits_settled_still_names_the_dead_rank() -> None:
    engine = Engine()
    found = drive(engine, JOB.messages())
    found += engine.process(exception(1, END + 1.01), END + 1.1)
    found += engine.process(job_end(END + 1.5), END + 1.6)
    found += engine.process(exit_(10, END + 1.0), END + 6.5)  # its agent was slow
    found += engine.tick(END + 6.7)  # the end's deadline passed: the job is finalised
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]


def test_a_rank_that_died_alone_is_named_when_every_rank_has_ended() -> None:
    """NCCL peers abort without a Python exception: no peer failure is ever told. Rank
    10 ended; host h000's ranks were stopped 12 s later (their launcher noticed)."""
    events = [exit_(10, END + 1.0)]
    events += [exit_(r, END + 1.1) for r in range(8, 16) if r != 10]  # its node's launcher
    events += [exit_(r, END + 13.0 + 0.01 * r) for r in range(8)]
    found = run(events, until=END + 30)
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]
    assert opened(found)[0].evidence["lead_s"] == pytest.approx(12.0, abs=0.01)


def test_hosts_stopped_within_a_second_of_each_other_name_nobody() -> None:
    """A cancel reaches the hosts at slightly different times."""
    events = [exit_(r, END + 1.0) for r in range(8, 16)]
    events += [exit_(r, END + 1.6) for r in range(8)]
    assert brief(run(events, until=END + 30)) == []


def test_a_users_own_connection_error_stays_a_user_error() -> None:
    """ "Connection reset by peer" from S3 or HTTP in the data loader is the user's: only
    the collective's transport's words (gloo, NCCL, c10d) make a peer failure (review)."""
    err = exception(
        0,
        END + 1.0,
        "('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))",
        "ConnectionError",
    )
    assert not is_peer_failure(err)
    assert brief(run([err, job_end(END + 1.5)])) == [("user_error", 0, "h000", "user")]


def test_a_cancel_of_four_hosts_names_nobody_though_a_peer_raised() -> None:
    """h000 signalled 70 ms before the others, a peer's gloo error racing its own end
    (review: it named h000's ranks)."""
    job = Job(world=16, steps=STOP, per_host=4)
    events = [exit_(r, END + 1.0, job.host(r)) for r in range(4)]
    events.append(exception(5, END + 1.05))
    events += [exit_(r, END + 1.07, job.host(r)) for r in range(4, 16)]
    events[-1] = exit_(15, END + 1.07, job.host(15))
    found = drive(Engine(), interleave(job.messages(), fix_hosts(events, job)), until=END + 30)
    assert brief(found) == []


def fix_hosts(events: list[EventMessage], job: Job) -> list[EventMessage]:
    import msgspec

    return [msgspec.structs.replace(e, host=job.host(e.rank)) for e in events]  # type: ignore[arg-type]


def test_a_hang_after_most_ranks_finished_names_nobody() -> None:
    """Ranks 1-15 ended (no job_end: only rank 0 sends it) while rank 0 uploads the model
    for minutes: a plain hang as before, not rank 1 "killed or crashed" (review)."""
    found = run([exit_(r, END + 1.0) for r in range(1, 16)], until=END + 200)
    assert [(d.type, d.rank) for d in opened(found)] == [("hang", None)]


def test_hosts_clocks_seconds_apart_do_not_make_a_cancel_a_crash() -> None:
    """h001's clock 2 s behind (under the 5 s the job's clock corrects): a cancel reaching
    every host within 0.2 s named h001's ranks "1.9 s before any rank on another host"."""
    import msgspec

    from stepwatch.contract import StepMessage

    off = -2.0
    msgs = []
    for m in JOB.messages():
        if m.host == "h001":
            recs = [
                msgspec.structs.replace(r, start=r.start + off, end=r.end + off) for r in m.steps
            ]
            m = StepMessage(host=m.host, ts=m.ts + off, job_id=m.job_id, steps=recs)
        msgs.append(m)
    events = [exit_(r, END + 1.0 + 0.01 * r + (off if r >= 8 else 0.0)) for r in range(16)]
    events.insert(3, exception(1, END + 1.05))
    found = drive(Engine(), interleave(msgs, events), until=END + 40)
    assert brief(found) == []


def test_a_restart_before_the_exits_settled_still_names_the_dead_rank() -> None:
    """The next run's first steps (a rewind) came 2 s after the last exit, before the 3 s
    settling: the old run's exits were forgotten unnamed (review)."""
    import msgspec

    from stepwatch.contract import StepMessage

    events = [exit_(10, END + 1.0), exception(1, END + 1.05)]
    events += [exit_(r, END + 2.5 + 0.01 * r) for r in range(16) if r not in (0, 10)]
    dt = END + 4.7 - T0
    again = [
        StepMessage(
            host=m.host,
            ts=m.ts + dt,
            job_id=m.job_id,
            steps=[
                msgspec.structs.replace(r, start=r.start + dt, end=r.end + dt, step=r.step + 20)
                for r in m.steps
            ],
        )
        for m in Job(world=16, steps=8, seed=3).messages()
    ]
    engine = Engine()
    found = drive(engine, interleave(JOB.messages(), events))
    found += drive(engine, again)
    assert ("rank_missing", 10, "h001", "unknown") in brief(found)


KILL, SEGV, ABRT, TERM = 9, 11, 6, 15


def torn_down(first: EventMessage, **how: int) -> list[EventMessage]:
    """``first``, then every other rank ended 50-80 ms later, as ``how`` says: within a
    second, which timing alone takes for a cancel."""
    rest = [exit_(r, END + 1.05, **how) for r in range(8, 16) if r != first.rank]
    return [first, *rest, *(exit_(r, END + 1.08, **how) for r in range(8))]


def test_a_rank_the_kernel_says_was_killed_is_named_though_all_ended_at_once() -> None:
    """One node's torchrun (or mp.spawn) stops the rest within its 0.1 s poll: every
    rank ended within a second and no peer raised, which timing alone takes for a
    cancel (nobody named). The agent read each process's status before its parent
    reaped it: rank 10 was killed, the others were terminated."""
    found = run(torn_down(exit_(10, END + 1.0, signal=KILL), signal=TERM))
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]
    d = opened(found)[0]
    assert d.evidence["signal"] == "SIGKILL"
    assert "killed by SIGKILL" in d.summary


def test_a_rank_stopped_on_another_host_within_50_ms_does_not_hide_the_killed_one() -> None:
    """One launcher drives both (emulated) hosts: its SIGTERM reached h000's ranks 20 ms
    after rank 10 died, which host clocks cannot order (those ranks are among the
    first): the kernel's word tells them apart."""
    events = [exit_(10, END + 1.0, signal=KILL)]
    events += [exit_(r, END + 1.02, signal=TERM) for r in range(16) if r != 10]
    found = run(events)
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]


def test_a_segfault_and_peers_that_failed_names_the_rank() -> None:
    found = run(torn_down(exit_(10, END + 1.0, signal=SEGV), exit_code=1))
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]


@pytest.mark.parametrize(
    ("first", "rest"),
    [
        ({"signal": TERM}, {"signal": TERM}),  # a cancel
        ({"signal": KILL}, {"signal": KILL}),  # scancel -s KILL, a cgroup's OOM kill
        ({"signal": SEGV}, {"exit_code": 0}),  # a segfault in exit handlers at the finish
        ({"signal": ABRT}, {"signal": TERM}),  # NCCL's watchdog aborting a healthy rank
        ({"signal": KILL}, {}),  # the others reaped before their agents looked
        ({"signal": 300}, {"signal": TERM}),  # not a signal
    ],
)
def test_how_ranks_ended_names_nobody_unless_one_was_killed_and_the_rest_stopped(
    first: dict[str, int], rest: dict[str, int]
) -> None:
    assert brief(run(torn_down(exit_(10, END + 1.0, **first), **rest))) == []


def test_a_rank_that_exited_with_an_error_and_the_rest_stopped_is_named() -> None:
    """A real mp.spawn DDP job (gloo, 4 ranks): rank 1 left by ``os._exit(3)`` at step
    40, no exception the SDK could see, and the launcher terminated the other ranks
    25-35 ms later. Nobody was named (no rank killed, every rank ended within a
    second): the job died and stepwatch said nothing."""
    found = run(torn_down(exit_(10, END + 1.0, exit_code=3), signal=TERM))
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]
    d = opened(found)[0]
    assert d.evidence["exit_code"] == 3
    assert "exited with code 3" in d.summary


@pytest.mark.parametrize(
    "rest",
    [
        {"exit_code": 1},  # every rank erroring out (peers' errors, handlers of a cancel)
        {"signal": KILL},  # killed after it: a whole job killed
        {"exit_code": 0},  # the others finished
        {},  # the others reaped before their agents looked
    ],
)
def test_a_rank_that_failed_first_is_not_named_unless_the_rest_were_stopped(
    rest: dict[str, int],
) -> None:
    assert brief(run(torn_down(exit_(10, END + 1.0, exit_code=3), **rest))) == []


def test_how_the_named_rank_ended_is_in_its_reason_and_evidence() -> None:
    """Rank 10 left with exit code 0 (uneven data, say) and its peers then failed: it is
    named as before, and the reason no longer guesses "killed or crashed"."""
    found = run([exit_(10, END + 1.0, exit_code=0), exception(1, END + 1.01)])
    assert brief(found) == [("rank_missing", 10, "h001", "unknown")]
    d = opened(found)[0]
    assert d.evidence["exit_code"] == 0
    assert "its process was exited with code 0" not in d.summary
    assert "exited with code 0" in d.summary and "killed or crashed" not in d.summary


def test_a_rank_that_finished_first_with_code_0_is_not_named_for_its_lead() -> None:
    """Every rank leaves by os._exit(0), no job_end; h001's ranks 12 s before h000's
    (which upload, say). Timing alone named rank 10 (the lead); its code 0 says it
    finished."""
    events = [exit_(10, END + 1.0, exit_code=0)]
    events += [exit_(r, END + 1.1, exit_code=0) for r in range(8, 16) if r != 10]
    events += [exit_(r, END + 13.0 + 0.01 * r, exit_code=0) for r in range(8)]
    assert brief(run(events, until=END + 30)) == []


def test_an_interrupted_job_end_is_no_user_error() -> None:
    """A Ctrl-C or SIGINT: the SDK's job_end says interrupted (code 130): stopped by
    someone, as a cancel, not the owner's code failing."""
    assert brief(run([job_end(END + 1.0, 130, "interrupted: KeyboardInterrupt")])) == []
    assert [b[0] for b in brief(run([job_end(END + 1.0)]))] == ["user_error"]
