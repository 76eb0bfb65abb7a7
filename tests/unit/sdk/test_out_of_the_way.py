"""The SDK stays out of the training job's way where a review found it did not.

Before: ``close()`` waited without bound for a sender thread stuck in a step's
``loss`` (a tensor on a hung GPU), so the process never exited; ``checkpoint``
with a ``pathlib.Path`` raised into the loop; an event detail whose ``str()``
raised escaped; in a forked child (a DataLoader worker) records sat in a queue
no thread drained (counted as sent), or (inline) went out under the rank's
identity twice; ``STEPWATCH_CONFIG`` naming a FIFO blocked ``init``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import stepwatch
from stepwatch.contract.records import EventType
from stepwatch.errors import ConfigError
from stepwatch.sdk.client import StepWatch
from stepwatch.settings import read_config_file
from tests.support.sdk_agent import FakeAgent


def init(agent: FakeAgent, **kw: object) -> StepWatch:
    args: dict[str, object] = {"agent_socket": agent.path, "env": {}, "job_events": False}
    return stepwatch.init("job-1", **{**args, **kw})  # type: ignore[arg-type]


class StuckLoss:
    """A loss whose value never comes until released (a tensor on a hung GPU)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __float__(self) -> float:
        self.release.wait(60)
        return 1.0


def test_close_returns_within_its_timeout_when_the_sender_thread_is_stuck(agent) -> None:
    sw = init(agent, flush_interval=0.01)
    loss = StuckLoss()
    try:
        with sw.step() as s:
            s.loss = loss
        for _ in range(3):
            with sw.step():
                pass
        time.sleep(0.2)  # the sender thread is now inside float(loss)
        started = time.monotonic()
        sw.close(timeout=0.5)
        took = time.monotonic() - started
    finally:
        loss.release.set()
    assert took < 5.0  # before: as long as the thread stayed stuck (here 60 s)
    assert sw.stats()["dropped_by"].get("close_timeout", 0) >= 1


def test_a_checkpoint_path_may_be_a_path_object(agent) -> None:
    sw = init(agent, flush_interval=0.01)
    with sw.checkpoint("save", path=Path("/ckpt") / "step7"):
        pass
    sw.checkpoint("load", duration=1.5, path=Path("/ckpt/step7"))
    sw.close()
    _, events = agent.split()
    assert [(e.type, e.attrs["path"]) for e in events] == [
        (EventType.CHECKPOINT_BEGIN, "/ckpt/step7"),
        (EventType.CHECKPOINT_SAVE, "/ckpt/step7"),
        (EventType.CHECKPOINT_LOAD, "/ckpt/step7"),
    ]


def test_an_event_whose_detail_cannot_be_read_is_not_raised(agent) -> None:
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    sw = init(agent)
    sw.event("restart", Broken())  # type: ignore[arg-type]
    sw.event("restart", "fine", why=Broken())
    assert sw.stats()["misuse"].get("bad_event", 0) >= 1
    sw.close()


@pytest.mark.parametrize("background", [True, False])
def test_a_forked_child_sends_nothing_under_the_ranks_identity(agent, background) -> None:
    sw = init(agent, flush_interval=0.01, background=background)
    with sw.step():
        pass
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker, say
        try:
            with sw.step():
                pass
            sw.event("restart", "from the child")
            sw.close()
            os.write(write, b"off" if not sw.enabled else b"on")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 8) == b"off"
    with sw.step():
        pass
    sw.close()
    steps, events = agent.split()
    assert [d.step.step for d in steps] == [0, 1] and events == []


def test_a_config_file_that_is_not_a_plain_file_is_refused_at_once(tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, words in ((fifo, "not a plain file"), (Path("/dev/zero"), "not a plain file")):
        with pytest.raises(ConfigError, match=words):
            read_config_file(str(path), set())
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        read_config_file(str(big), set())


def test_out_of_range_numbers_are_logged_and_skipped_not_sent_to_be_refused(agent) -> None:
    """Before, one ``step=2**64`` made every later auto-numbered step one the agent
    refuses, and ``samples=10**400`` dropped the whole step as an error."""
    sw = init(agent, flush_interval=0.01)
    with sw.step(2**64):
        pass
    with sw.step(samples=10**400, tokens=2**70):
        pass
    with sw.step():
        pass
    sw.close()
    steps = [d.step for d in agent.steps()]
    assert [(r.step, r.samples, r.tokens) for r in steps] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    assert sw.stats()["misuse"].get("bad_step", 0) == 1


@pytest.mark.parametrize(
    "identity",
    [
        {"job_id": "j" * 300},
        {"job_id": "42\x1b[2J"},
        {"host": "h" * 300},
        {"gpu": 99999},
    ],
)
def test_an_identity_the_agent_refuses_turns_the_sdk_off_with_one_warning(
    agent, identity, caplog
) -> None:
    """Before, every step was sent and every one refused by the agent, with no word."""
    args: dict[str, object] = {"job_id": "job-1", "rank": 0, "world_size": 1, **identity}
    sw = stepwatch.init(agent_socket=agent.path, env={}, job_events=False, **args)  # type: ignore[arg-type]
    with sw.step():
        pass
    sw.close()
    assert not sw.enabled and agent.steps() == []
    assert "the agent refuses this identity" in caplog.text


def _sender_threads() -> int:
    return sum(1 for t in threading.enumerate() if "stepwatch" in t.name.lower())


def test_init_again_replaces_the_earlier_handle_and_its_job_goes_on(agent) -> None:
    """Before, each ``init`` without ``close`` left its sender thread (and an at-exit and
    at-fork hook) behind, and rank 0 sent ``job_start`` again for the same job."""
    before = _sender_threads()
    handles = [
        stepwatch.init("job-1", rank=0, world_size=2, agent_socket=agent.path, env={})
        for _ in range(5)
    ]
    assert _sender_threads() <= before + 1
    assert [sw.enabled for sw in handles] == [False] * 4 + [True]
    with handles[-1].step():
        pass
    handles[-1].close()
    steps, events = agent.split()
    assert [e.type for e in events] == [EventType.JOB_START, EventType.JOB_END]
    assert [d.step.step for d in steps] == [0]


def test_init_for_another_job_ends_the_earlier_one(agent) -> None:
    first = stepwatch.init("job-a", rank=0, world_size=1, agent_socket=agent.path, env={})
    second = stepwatch.init("job-b", rank=0, world_size=1, agent_socket=agent.path, env={})
    second.close()
    _, events = agent.split()
    seen = [(e.job_id, e.type) for e in events]
    assert seen == [
        ("job-a", EventType.JOB_START),
        ("job-a", EventType.JOB_END),
        ("job-b", EventType.JOB_START),
        ("job-b", EventType.JOB_END),
    ]
    assert not first.enabled


def test_init_for_another_rank_in_the_same_process_leaves_the_first_alone(agent) -> None:
    """One process may drive several ranks (a GPU each). Before, each rank's ``init``
    closed the earlier ranks' handles: rank 0's ``job_end`` went out at rank 1's init."""
    r0 = stepwatch.init("job-m", rank=0, world_size=2, agent_socket=agent.path, env={})
    r1 = stepwatch.init("job-m", rank=1, world_size=2, agent_socket=agent.path, env={})
    assert r0.enabled and r1.enabled
    for sw in (r0, r1):
        with sw.step():
            pass
    r1.close()
    r0.close()
    steps, events = agent.split()
    assert sorted(d.step.rank for d in steps) == [0, 1]
    assert [e.type for e in events] == [EventType.JOB_START, EventType.JOB_END]


def test_init_again_keeps_the_error_an_earlier_handle_saw(agent) -> None:
    first = stepwatch.init("job-f", rank=0, world_size=1, agent_socket=agent.path, env={})
    with pytest.raises(ValueError), first.step():
        raise ValueError("bad batch")
    second = stepwatch.init("job-f", rank=0, world_size=1, agent_socket=agent.path, env={})
    second.close()
    _, events = agent.split()
    assert [e.type for e in events] == [EventType.JOB_START, EventType.EXCEPTION, EventType.JOB_END]
    assert events[-1].detail == "error: ValueError"


def test_inits_from_several_threads_leave_one_handle_on(agent) -> None:
    handles: list[StepWatch] = []
    gate = threading.Barrier(8)

    def start() -> None:
        gate.wait()
        handles.append(stepwatch.init("job-t", rank=3, world_size=4, agent_socket=agent.path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(sw.enabled for sw in handles) == 1
    for sw in handles:
        sw.close()


EXIT_ORDER = """
import atexit, sys
import stepwatch
import stepwatch.sdk.client  # imported early, as an integration's import does
atexit.register(lambda: print("provider shutdown", flush=True))  # as OTel's provider does
sw = stepwatch.init("job-x", rank=1, world_size=2, agent_socket=sys.argv[1], env={})
close = sw.close
def noted(*args, **kw):
    print("sdk close", flush=True)
    close(*args, **kw)
sw.close = noted
"""


def test_the_sdk_closes_at_exit_before_what_the_program_set_up_earlier(agent) -> None:
    """Before, the at-exit hook was registered at import: it ran after an OpenTelemetry
    provider's shutdown registered later, and the last step's spans were lost."""
    out = subprocess.run(
        [sys.executable, "-c", EXIT_ORDER, agent.path],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.stdout.split("\n")[:2] == ["sdk close", "provider shutdown"], out


def test_init_in_a_child_forked_while_another_thread_held_the_handles_lock(agent) -> None:
    from stepwatch.sdk.client import handles_locked

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with handles_locked():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: the holder thread is not here; init must not wait for it
        code = 1
        try:
            sw = stepwatch.init("job-c", rank=0, world_size=1, agent_socket=agent.path, env={})
            sw.close()
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("init in the forked child waited for a lock no thread there holds")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"job_id": "job-l", "rank": 0, "world_size": 1}, {"job_id": "job-l", "rank": 3}),
        ({"job_id": "job-a", "rank": 0, "world_size": 4}, {"job_id": "job-b", "rank": 1}),
    ],
    ids=["rank_learned_later", "another_job"],
)
def test_init_as_another_rank_of_another_job_or_size_replaces_the_earlier(
    agent, first, second
) -> None:
    """A library's init before the rank was known (rank 0 of 1), then the real one: the
    stale handle is replaced, not left to send rank 0's job_end at exit."""
    old = stepwatch.init(**first, agent_socket=agent.path, env={})
    new = stepwatch.init(**second, world_size=4, agent_socket=agent.path, env={})
    assert not old.enabled and new.enabled
    new.close()
    old.close()
    _, events = agent.split()
    ends = [(e.job_id, e.type) for e in events if e.type is EventType.JOB_END]
    assert ends == ([("job-a", EventType.JOB_END)] if first["job_id"] == "job-a" else [])
