"""User error vs system fault."""

from __future__ import annotations

from stepwatch.contract import EventType
from stepwatch.streams.core import Engine
from tests.support.detect_synth import T0, Job, drive, event, gpu_message, interleave, opened


def _end(job: Job, messages: list, code: int, detail: str = "error"):  # type: ignore[no-untyped-def]
    t = max(r.end for m in messages for r in m.steps) + 0.5
    return event(EventType.JOB_END, "h000", t, job_id=job.job_id, rank=0, code=code, detail=detail)


def test_nan_loss_is_a_user_error_once() -> None:
    job = Job(world=16, steps=40, nan_from=25)
    found = drive(Engine(), job.messages())
    errors = opened(found)
    assert [(d.type, d.cause, d.fault, d.step) for d in errors] == [
        ("user_error", "user", "user", 25)
    ]


def test_exception_event_is_a_user_error() -> None:
    job = Job(world=16, steps=30)
    exc = event(
        EventType.EXCEPTION,
        "h001",
        T0 + 20.5,
        job_id=job.job_id,
        rank=9,
        detail="RuntimeError: CUDA out of memory",
    )
    found = opened(drive(Engine(), interleave(job.messages(), [exc])))
    assert [(d.type, d.rank, d.fault) for d in found] == [("user_error", 9, "user")]
    assert "out of memory" in str(found[0].evidence["exception"])


def test_exception_after_a_fatal_xid_is_not_blamed_on_the_user() -> None:
    job = Job(world=16, steps=30)
    xid = event(EventType.XID, "h001", T0 + 20.2, gpu=1, code=48, detail="DBE")
    exc = event(
        EventType.EXCEPTION,
        "h001",
        T0 + 20.5,
        job_id=job.job_id,
        rank=9,
        detail="RuntimeError: CUDA error: uncorrectable ECC error encountered",
    )
    found = opened(drive(Engine(), interleave(job.messages(), [xid, exc])))
    assert [(d.type, d.rank, d.cause, d.fault) for d in found] == [
        ("rank_missing", 9, "hardware", "system")
    ]


def test_job_failing_without_a_hardware_signal_is_a_user_error() -> None:
    job = Job(world=16, steps=30)
    messages = job.messages()
    samples = [gpu_message(h, T0 + k) for k in range(35) for h in job.hosts()]
    found = opened(drive(Engine(), interleave(messages, [*samples, _end(job, messages, 1)])))
    assert [(d.type, d.fault) for d in found] == [("user_error", "user")]
    assert found[0].evidence["exit_code"] == 1


def test_job_failing_with_a_hardware_signal_is_not_a_user_error() -> None:
    job = Job(world=16, steps=30)
    messages = job.messages()
    bad = {2: {"ecc_dbe_total": 3}}
    samples = [
        gpu_message(h, T0 + k, bad if k > 25 and h == "h001" else None)
        for k in range(35)
        for h in job.hosts()
    ]
    found = opened(drive(Engine(), interleave(messages, [*samples, _end(job, messages, 1)])))
    assert [d.type for d in found] == []


def test_job_completing_normally_is_no_error() -> None:
    job = Job(world=16, steps=30)
    messages = job.messages()
    assert drive(Engine(), [*messages, _end(job, messages, 0, "completed")]) == []
