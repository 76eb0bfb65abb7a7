"""End to end through a real Unix datagram socket: steps, marks, exceptions, checkpoints."""

from __future__ import annotations

import math
import os
import sys
import time
import weakref
from collections.abc import Iterator

import pytest

import stepwatch
from stepwatch.contract.codec import check_step
from stepwatch.contract.records import EventType, StepRecord
from stepwatch.sdk.client import StepWatch
from tests.support.sdk_agent import FakeAgent


@pytest.fixture()
def sw(agent: FakeAgent) -> Iterator[StepWatch]:
    handle = stepwatch.init(
        "job-7",
        rank=3,
        world_size=8,
        local_rank=3,
        host="node01",
        agent_socket=agent.path,
        env={},
        flush_interval=0.01,
    )
    yield handle
    handle.close()


def records(agent: FakeAgent) -> list[StepRecord]:
    return [d.step for d in agent.steps()]


def test_steps_arrive_as_contract_records(sw: StepWatch, agent: FakeAgent) -> None:
    for _ in range(3):
        with sw.step(samples=32, tokens=32 * 4096) as s:
            with s.phase("data"):
                time.sleep(0.002)
            with s.phase("forward"):
                pass
            with s.phase("backward"):
                pass
            with s.phase("comm_wait"):
                time.sleep(0.001)
            with s.phase("optimizer"):
                pass
            with s.phase("embedding-sync"):
                pass
            s.loss = 2.25
            s.flops = 1.5e15
    assert sw.flush(2.0)
    got = records(agent)
    assert [r.step for r in got] == [0, 1, 2]
    first = got[0]
    assert (first.job_id, first.rank, first.world_size, first.host) == ("job-7", 3, 8, "node01")
    assert (first.samples, first.tokens, first.loss, first.flops) == (32, 131072, 2.25, 1.5e15)
    assert first.timing == "wall"
    assert first.phases is not None
    assert first.phases.data is not None and first.phases.data >= 0.002
    assert first.phases.comm_wait is not None and first.phases.comm_wait >= 0.001
    assert set(first.phases.extra) == {"embedding-sync"}
    assert first.end - first.start >= first.phases.data + first.phases.comm_wait
    assert abs(first.start - time.time()) < 60
    for record in got:
        check_step(record, time.time())  # the contract's own validation accepts them
    assert sw.sent == 3 and sw.dropped == 0


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_is_reported_as_such(sw: StepWatch, agent: FakeAgent, loss: float) -> None:
    with sw.step() as s:
        s.loss = loss
    sw.flush(2.0)
    (record,) = records(agent)
    assert record.loss is None and record.loss_nonfinite is True


def test_explicit_step_numbers_and_auto_increment(sw: StepWatch, agent: FakeAgent) -> None:
    with sw.step(100):
        pass
    with sw.step():
        pass
    sw.flush(2.0)
    assert [r.step for r in records(agent)] == [100, 101]


def test_marks_api(sw: StepWatch, agent: FakeAgent) -> None:
    for _ in range(2):
        sw.mark("batch-generator")
        time.sleep(0.002)
        sw.mark("forward-backward")
        time.sleep(0.001)
        sw.mark("all-grads-sync")
        sw.end_phase()
        sw.end_step(samples=8, tokens=8192, loss=1.0)
    sw.flush(2.0)
    got = records(agent)
    assert [r.step for r in got] == [0, 1]
    phases = got[0].phases
    assert phases is not None
    assert phases.data is not None and phases.data >= 0.002
    assert phases.forward is not None and phases.forward >= 0.001
    assert phases.comm_wait is not None and phases.backward is None
    assert (got[0].samples, got[0].tokens, got[0].loss) == (8, 8192, 1.0)


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError (torch is not installed here)."""


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (ValueError("bad batch"), "ValueError"),
        (OutOfMemoryError("Tried to allocate 2.00 GiB"), "OOM"),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), "OOM"),
    ],
)
def test_exception_propagates_unchanged_and_is_reported(
    sw: StepWatch, agent: FakeAgent, error: Exception, detail: str
) -> None:
    with pytest.raises(type(error)) as info, sw.step() as s, s.phase("forward"):
        raise error
    assert info.value is error
    sw.flush(2.0)
    steps, events = agent.split()
    assert steps == []  # an interrupted step is not a timing sample
    (event,) = events
    assert event.type is EventType.EXCEPTION and event.detail == detail
    assert (event.job_id, event.rank, event.gpu) == ("job-7", 3, 3)
    assert event.attrs["step"] == 0 and event.attrs["oom"] is (detail == "OOM")
    assert str(event.attrs["exception"]).endswith(type(error).__name__)


def test_keyboard_interrupt_propagates_without_event(sw: StepWatch, agent: FakeAgent) -> None:
    with pytest.raises(KeyboardInterrupt), sw.step():
        raise KeyboardInterrupt
    sw.flush(2.0)
    assert agent.receive() == []


def test_checkpoint_events(sw: StepWatch, agent: FakeAgent) -> None:
    with sw.step(7) as s:
        with s.phase("forward"):
            pass
        with sw.checkpoint("save", path="/ckpt/step7"):
            time.sleep(0.003)
    sw.checkpoint("load", duration=12.5)
    sw.flush(2.0)
    steps, events = agent.split()
    assert steps[0].step.phases is not None
    assert (steps[0].step.phases.checkpoint or 0) >= 0.003
    begin, save, load = events  # a begin as the save starts; none for a measured load
    assert begin.type is EventType.CHECKPOINT_BEGIN and begin.detail == "save"
    assert begin.attrs["step"] == 7 and begin.attrs["path"] == "/ckpt/step7"
    assert begin.attrs["start"] == save.attrs["start"] and begin.ts <= save.ts
    assert save.type is EventType.CHECKPOINT_SAVE and save.attrs["step"] == 7
    assert float(save.attrs["duration_s"]) >= 0.003 and save.attrs["path"] == "/ckpt/step7"
    assert load.type is EventType.CHECKPOINT_LOAD and load.attrs["duration_s"] == 12.5


def test_custom_event_and_group(sw: StepWatch, agent: FakeAgent) -> None:
    sw.event("restart", "elastic restart", attempt=2)
    sw.set_group("pp3")
    with sw.step():
        pass
    sw.flush(2.0)
    steps, events = agent.split()
    assert events[0].type is EventType.RESTART and events[0].attrs == {"attempt": 2}
    assert steps[0].step.group == "pp3" and sw.identity.group == "pp3"


def test_a_nan_attribute_and_a_non_utf8_path_cost_no_event(sw: StepWatch, agent: FakeAgent) -> None:
    """A NaN went as JSON null, which the agent refused (schema), and a lone surrogate
    (os.fsdecode of a non-UTF-8 name) failed the encoder: the SDK counted the first as
    sent, and both events, a user's own report of a NaN loss among them, were lost."""
    odd = os.fsdecode(b"/ckpt/\xff.pt")
    sw.event("restart", f"from {odd}", loss=float("nan"), peak=float("-inf"), path=odd,
             **{"k\udcff": 1})  # fmt: skip
    with pytest.raises(RuntimeError), sw.step():
        raise RuntimeError(f"cannot load {odd}")  # a user's message, with the name as it is
    sw.flush(2.0)
    _, events = agent.split()
    restart, failed = events
    assert restart.attrs == {"loss": "nan", "peak": "-inf", "path": "/ckpt/\ufffd.pt", "k\ufffd": 1}
    assert restart.detail == "from /ckpt/\ufffd.pt"
    assert failed.type is EventType.EXCEPTION and "\ufffd" in str(failed.attrs["message"])
    assert sw.stats()["dropped"] == 0


def test_counts_beyond_a_steps_ceiling_cost_the_count_not_the_step(
    sw: StepWatch, agent: FakeAgent
) -> None:
    """The contract bounds one step's tokens (2^40) and FLOPs (1e24) so that the store's
    per-minute sums cannot wrap: the SDK sends the step without what it cannot carry."""
    with sw.step(samples=8, tokens=2**41, flops=1e30):
        pass
    with sw.step(samples=8, tokens=2**40, flops=1e24):
        pass
    sw.flush(2.0)
    got = [(r.samples, r.tokens, r.flops) for r in records(agent)]
    assert got == [(8, 0, None), (8, 2**40, 1e24)]


def test_a_rank_cannot_report_the_hosts_hardware_events(sw: StepWatch, agent: FakeAgent) -> None:
    """XID, ECC and link events are the agent's collectors' (its socket refuses them)."""
    for kind in ("xid", "ecc", "link_state"):
        sw.event(kind, "forged", code=79)
    sw.event("restart", "real")
    sw.flush(2.0)
    _, events = agent.split()
    assert [e.type for e in events] == [EventType.RESTART]
    assert sw.stats()["misuse"]["bad_event"] == 3


def test_odd_phase_names_and_an_infinite_duration_cost_nothing_else(
    sw: StepWatch, agent: FakeAgent
) -> None:
    """A phase name with a control character made the agent refuse the whole step
    (schema), a ``None`` name dropped it in the SDK, and ``duration=inf`` went out as JSON
    null, which the agent refused: each one counted as sent (red team)."""
    with sw.step():
        with sw.phase("fwd\x1b[31m\nlevel=ERROR"):
            pass
        with sw.phase(None):  # type: ignore[arg-type]
            pass
    sw.checkpoint("save", duration=float("inf"))
    sw.flush(2.0)
    steps, events = agent.split()  # decoded by the agent's own rules
    assert len(steps) == 1 and events == []
    extra = steps[0].step.phases.extra  # type: ignore[union-attr]
    assert set(extra) == {"fwd\ufffd[31m\ufffdlevel=ERROR", "None"}
    assert sw.stats()["misuse"]["checkpoint_duration"] == 1


def test_close_flushes_everything(agent: FakeAgent) -> None:
    sw = stepwatch.init(
        "job-8", agent_socket=agent.path, env={}, flush_interval=30, job_events=False
    )
    for _ in range(5):
        with sw.step():
            pass
    sw.close()
    assert len(agent.steps()) == 5
    with sw.step():  # after close: recorded nowhere, still never raises
        pass
    assert sw.sent == 5


def test_inline_sender(agent: FakeAgent) -> None:
    sw = stepwatch.init(
        "job-9", agent_socket=agent.path, env={}, background=False, job_events=False
    )
    with sw.step(samples=4):
        pass
    assert sw.sent == 1  # sent before the step's `with` returned
    assert records(agent)[0].samples == 4
    sw.close()


def test_rank0_announces_job_start_and_end(agent: FakeAgent) -> None:
    env = {
        "RANK": "0",
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    sw = stepwatch.init("job-l", agent_socket=agent.path, env=env, flush_interval=0.01)
    with sw.step(3):
        pass
    sw.close()
    steps, (start, end) = agent.split()
    assert len(steps) == 1
    assert start.type is EventType.JOB_START and start.rank == 0
    assert start.attrs["world_size"] == 16 and start.attrs["restart_count"] == 2
    assert (end.type, end.code, end.detail) == (EventType.JOB_END, 0, "finished")
    assert end.attrs["last_step"] == 3


def test_job_end_says_error_after_an_exception(agent: FakeAgent) -> None:
    sw = stepwatch.init("job-e", rank=0, world_size=2, agent_socket=agent.path, env={})
    with pytest.raises(ValueError), sw.step():
        raise ValueError("bad")
    sw.close()
    _, events = agent.split()
    assert [e.type for e in events] == [EventType.JOB_START, EventType.EXCEPTION, EventType.JOB_END]
    assert (events[-1].code, events[-1].detail) == (1, "error: ValueError")


def test_job_end_at_exit_after_an_uncaught_exception(
    agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepwatch.sdk import client

    sw = stepwatch.init("job-x", rank=0, world_size=2, agent_socket=agent.path, env={})
    monkeypatch.setattr(sys, "last_value", RuntimeError("boom"), raising=False)
    client._close_at_exit(weakref.ref(sw))  # what atexit runs
    _, events = agent.split()
    assert events[-1].type is EventType.JOB_END and events[-1].detail == "error: RuntimeError"
    assert (events[-2].type, events[-2].attrs["message"]) == (EventType.EXCEPTION, "boom")


def test_other_ranks_send_no_job_events(sw: StepWatch, agent: FakeAgent) -> None:
    sw.close()
    assert agent.receive(timeout=0.05) == []


def test_job_end_is_clean_when_a_later_step_completed(agent: FakeAgent) -> None:
    sw = stepwatch.init("job-r", rank=0, world_size=2, agent_socket=agent.path, env={})
    with pytest.raises(RuntimeError), sw.step():
        raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
    with sw.step():  # the script caught it, lowered the batch size and went on
        pass
    sw.close()
    _, events = agent.split()
    assert (events[-1].type, events[-1].code, events[-1].detail) == (
        EventType.JOB_END,
        0,
        "finished",
    )


@pytest.mark.parametrize(
    ("raised", "code", "detail"),
    [
        (KeyboardInterrupt(), 130, "interrupted: KeyboardInterrupt"),
        (ValueError("bad shard"), 1, "error: ValueError"),
        (SystemExit(2), 1, "error: SystemExit"),
        (SystemExit(0), 0, "finished"),
    ],
)
def test_job_end_in_a_finally_says_what_is_on_its_way_out(
    agent: FakeAgent, raised: BaseException, code: int, detail: str
) -> None:
    """The README's loop closes in a ``finally``: an exception outside any step (a data
    loader's, a Ctrl-C between steps) went through it as ``finished``, code 0."""
    sw = stepwatch.init("job-f", rank=0, world_size=2, agent_socket=agent.path, env={})
    with pytest.raises(type(raised)):
        try:
            with sw.step():
                pass
            raise raised
        finally:
            sw.close()
    _, events = agent.split()
    assert (events[-1].type, events[-1].code, events[-1].detail) == (
        EventType.JOB_END,
        code,
        detail,
    )
    told = [e.detail for e in events if e.type is EventType.EXCEPTION]
    assert told == (["ValueError"] if isinstance(raised, ValueError) else [])


def test_every_rank_tells_an_exception_on_its_way_out_through_close(agent: FakeAgent) -> None:
    """A gloo error raised outside a step (an evaluation's all_reduce) on rank 1: the
    worker needs its text to tell a peer's failure from the user's error."""
    sw = stepwatch.init("job-g", rank=1, world_size=2, agent_socket=agent.path, env={})
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
        finally:
            sw.close()
    _, events = agent.split()
    assert [(e.type, e.detail) for e in events] == [(EventType.EXCEPTION, "RuntimeError")]
    assert "Connection closed by peer" in str(events[0].attrs["message"])


def test_job_end_at_exit_after_a_ctrl_c(agent: FakeAgent, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepwatch.sdk import client

    sw = stepwatch.init("job-c", rank=0, world_size=2, agent_socket=agent.path, env={})
    monkeypatch.setattr(sys, "last_value", KeyboardInterrupt(), raising=False)
    client._close_at_exit(weakref.ref(sw))
    _, events = agent.split()
    assert (events[-1].code, events[-1].detail) == (130, "interrupted: KeyboardInterrupt")
