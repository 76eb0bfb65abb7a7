"""Jobs sharing a host: one job's events say nothing of another's, and cost bounded memory.

Before, a host window kept one list of the last 128 events of every type and job on the
host: 130 checkpoint events of one job pushed the XID of another job's failed GPU out (its
stopped rank read as cause unknown), that job's exception was read as the other's cause,
an exception naming no job opened ``user_error`` on every job of the host, and an event of
65,000 attrs (a 1 MiB message) was kept whole, ~8 MB a copy.
"""

from __future__ import annotations

import msgspec

from stepwatch.contract import EventType, StepMessage
from stepwatch.streams.core import Engine
from stepwatch.streams.core.hostwindow import HostWindow
from tests.support.detect_synth import T0, Job, drive, event, opened

STOP = 40
T_XID = T0 + STOP - 1.5


def alice() -> list[StepMessage]:
    """16 ranks on h000/h001; rank 10 (h001) stops at step 40, after an XID 74 on its GPU."""
    out = []
    for m in Job(world=16, steps=60, job_id="job-a").messages():
        recs = [r for r in m.steps if not (r.rank == 10 and r.step >= STOP)]
        out.append(msgspec.structs.replace(m, steps=recs))
    return out


def mallory() -> list[StepMessage]:
    """Her own 2-rank job on h001, the shared node."""
    out = []
    for m in Job(world=2, steps=60, job_id="job-m", seed=3).messages():
        recs = [msgspec.structs.replace(r, host="h001") for r in m.steps]
        out.append(msgspec.structs.replace(m, host="h001", steps=recs))
    return out


def stopped_rank(extra: list) -> tuple[str, str, str]:
    xid = event(EventType.XID, "h001", T_XID, gpu=2, code=74, job_id="job-a", detail="XID 74")
    msgs = sorted([*alice(), *mallory(), xid, *extra], key=lambda m: m.ts)
    found = drive(Engine(), msgs, until=T0 + 80)
    (d,) = [d for d in opened(found, "rank_missing") if d.job_id == "job-a"]
    return d.cause, d.fault, d.summary


def test_another_jobs_events_leave_a_stopped_ranks_cause_alone() -> None:
    cause, fault, summary = stopped_rank([])
    assert (cause, fault) == ("gpu", "system") and summary.endswith("XID 74")
    loads = [
        event(EventType.CHECKPOINT_LOAD, "h001", T_XID + 0.1 + 0.001 * i, job_id="job-m", rank=0)
        for i in range(130)
    ]
    said = {"exception": "builtins.ValueError", "message": "your code is broken"}
    theirs = event(EventType.EXCEPTION, "h001", T_XID + 0.5, job_id="job-m", attrs=said)
    assert stopped_rank([*loads, theirs]) == (cause, fault, summary)


def test_another_jobs_exceptions_leave_a_ranks_own_exception_as_its_cause() -> None:
    """Exceptions were one list per host too: 130 caught exceptions a neighbour job reported
    pushed the stopped rank's own exception out (cause user became unknown)."""
    t_exc = T0 + STOP - 1.5
    said = {"exception": "builtins.ValueError", "message": "bad batch shape"}
    own = event(EventType.EXCEPTION, "h001", t_exc, job_id="job-a", rank=10, attrs=said)
    caught = {"exception": "botocore.exceptions.ReadTimeoutError", "message": "s3 timeout"}
    noisy = [
        event(EventType.EXCEPTION, "h001", t_exc + 0.1 + 0.001 * i, job_id="job-m", attrs=caught)
        for i in range(130)
    ]

    def causes(extra: list) -> list[tuple[str, str, str, str]]:
        msgs = sorted([*alice(), *mallory(), own, *extra], key=lambda m: m.ts)
        found = opened(drive(Engine(), msgs, until=T0 + 80))
        return [(d.type, d.cause, d.fault, d.summary) for d in found if d.job_id == "job-a"]

    alone = causes([])
    assert ("rank_missing", "user", "user") in [c[:3] for c in alone]
    assert causes(noisy) == alone
    # nor do exceptions under 16 job ids of a sender's choosing, or naming no job
    chosen = [
        event(EventType.EXCEPTION, "h001", t_exc + 0.2 + 0.01 * i, job_id=f"job-x{i}", rank=0)
        for i in range(16)
    ]
    jobless = [event(EventType.EXCEPTION, "h001", t_exc + 0.5 + 0.001 * i) for i in range(130)]
    assert causes([*chosen, *jobless]) == alone


def test_an_exception_naming_no_job_opens_nothing() -> None:
    a = Job(world=16, steps=60, job_id="job-alice")
    b = Job(world=8, steps=60, job_id="job-bob", seed=5)
    said = {"exception": "builtins.ValueError", "message": "see evil.example"}
    stray = event(EventType.EXCEPTION, "h000", T0 + 30.3, detail="ValueError", attrs=said)
    msgs = sorted([*a.messages(), *b.messages(), stray], key=lambda m: m.ts)
    assert opened(drive(Engine(), msgs, until=T0 + 70)) == []


def test_a_host_window_keeps_what_its_readers_read_of_an_event() -> None:
    win = HostWindow("h001", 8)
    huge = {f"k{i}": "x" * 10 for i in range(65_000)}
    win.add(event(EventType.CHECKPOINT_SAVE, "h001", T0, job_id="j", attrs=huge))
    assert not win.events and not win.exceptions  # nothing reads a job's own events here
    win.add(event(EventType.EXCEPTION, "h001", T0, job_id="j", detail="E" * 5000,
                  attrs={**huge, "message": "m" * 5000, "exception": "builtins.E"}))  # fmt: skip
    (kept,) = win.exceptions["j"]
    assert sorted(kept.attrs) == ["exception", "message"] and len(kept.attrs["message"]) == 1024
    assert len(kept.detail) == 1024


def test_a_job_whose_id_is_empty_still_gets_its_own_exception() -> None:
    """The contract allows a job id of "" (a producer with no scheduler id): its exception
    names that job, not no job (an event's job_id None is no job)."""
    msgs = []
    for m in Job(world=8, steps=60, job_id="").messages():
        recs = [r for r in m.steps if not (r.rank == 3 and r.step >= STOP)]
        msgs.append(msgspec.structs.replace(m, steps=recs))
    host = next(r.host for m in msgs for r in m.steps if r.rank == 3)
    said = {"exception": "builtins.ValueError", "message": "shape mismatch"}
    own = event(EventType.EXCEPTION, host, T0 + STOP - 1.0, job_id="", rank=3, attrs=said)
    found = opened(drive(Engine(), sorted([*msgs, own], key=lambda m: m.ts), until=T0 + 80))
    assert {(d.type, d.cause) for d in found} == {("user_error", "user"), ("rank_missing", "user")}
