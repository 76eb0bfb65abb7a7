"""Never raise, never block: no agent, full queues, garbage settings, misuse logged once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import stepwatch
from stepwatch.sdk.client import StepWatch
from stepwatch.sdk.cuda import TimingEvent
from tests.support.sdk_agent import FakeAgent


@pytest.fixture()
def absent() -> Iterator[FakeAgent]:
    fake = FakeAgent(listen=False)
    yield fake
    fake.close()


def run_steps(sw: StepWatch, n: int) -> None:
    for _ in range(n):
        with sw.step(samples=1) as s:
            with s.phase("forward"):
                pass
            s.loss = 1.0


def test_no_agent_drops_and_counts(absent: FakeAgent) -> None:
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={}, flush_interval=0.01
    )
    run_steps(sw, 50)
    assert sw.flush(2.0)
    assert (sw.sent, sw.dropped, sw.stats()["held"]) == (0, 0, 50)  # held for the agent
    sw.close()
    assert (sw.sent, sw.dropped) == (0, 50)  # never came: dropped and counted at close
    assert sw.stats()["dropped_by"] == {"no_agent": 50}


def test_agent_that_comes_up_later_is_found(absent: FakeAgent) -> None:
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={}, flush_interval=0.01
    )
    run_steps(sw, 2)
    sw.flush(2.0)
    absent.listen()
    run_steps(sw, 3)
    sw.flush(2.0)
    sw.close()
    assert (sw.sent, sw.dropped) == (5, 0)  # the two held while it was away arrive too
    assert [d.step.step for d in absent.steps()] == [0, 1, 2, 3, 4]


def test_full_queue_drops_at_submit(absent: FakeAgent) -> None:
    # the sender thread sleeps for a minute: the bounded queue fills and drops
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={}, queue_size=3, flush_interval=60
    )
    run_steps(sw, 10)
    assert sw.stats()["dropped_by"] == {"queue_full": 7}
    sw.close()
    assert sw.stats()["dropped_by"] == {"queue_full": 7, "no_agent": 3}


def test_agent_not_reading_fills_its_buffer(absent: FakeAgent) -> None:
    absent.listen()  # bound, never read
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={}, flush_interval=0.01
    )
    run_steps(sw, 400)
    sw.close(timeout=5.0)
    dropped = sw.stats()["dropped_by"]
    assert dropped.get("buffer_full", 0) > 0
    assert sw.sent + sw.dropped == 400
    assert len(absent.steps()) == sw.sent


def test_garbage_settings_never_raise(absent: FakeAgent, caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "STEPWATCH_PARTITIONS": "many",  # makes Settings.load fail
        "STEPWATCH_AGENT_SOCKET": absent.path,
        "STEPWATCH_TIMING": "quantum",
        "STEPWATCH_ENABLED": "maybe",
        "STEPWATCH_OTEL": "perhaps",
        "RANK": "first",
        "WORLD_SIZE": "lots",
    }
    absent.listen()
    sw = stepwatch.init(
        job_events=False, env=env, flush_interval=0.01, tracer_provider=object(), otel=True
    )
    run_steps(sw, 2)
    sw.flush(2.0)
    assert sw.enabled and sw.timing == "wall"
    assert len(absent.steps()) == 2  # the socket path still came from the environment
    sw.close()


@pytest.mark.parametrize("path", ["x" * 300, "", "/nonexistent-dir/agent.sock"])
def test_unusable_socket_paths_never_raise(path: str) -> None:
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=path or None, env={"STEPWATCH_AGENT_SOCKET": path}
    )
    run_steps(sw, 3)
    sw.close()
    assert sw.sent == 0 and sw.dropped == 3


def test_disabled_records_nothing(absent: FakeAgent) -> None:
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={"STEPWATCH_ENABLED": "0"}
    )
    run_steps(sw, 3)
    sw.mark("forward")
    sw.end_step()
    assert not sw.enabled and sw.stats()["sent"] == 0 and sw.dropped == 0
    sw.close()


def test_misuse_is_logged_once_and_counted(
    absent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stepwatch")
    absent.listen()
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={}, flush_interval=0.01
    )
    got = []
    for _ in range(3):
        with sw.step(), sw.step():  # nested step
            pass
        with sw.phase("forward"):  # phase outside a step
            pass
        with sw.step(5):
            pass
        with sw.step(5):  # the same step number again
            pass
        with sw.step() as s:  # a phase never closed
            s.phase("forward").__enter__()
        sw.end_step()  # no step open
        sw.flush(2.0)
        got += absent.steps()  # the agent's queue holds only a few datagrams
    misuse = sw.stats()["misuse"]
    assert misuse == {
        "nested_step": 3,
        "phase_outside_step": 3,
        "step_backwards": 5,
        "phase_not_closed": 3,
        "end_without_step": 3,
    }
    messages = [r.getMessage() for r in caplog.records if r.name == "stepwatch.sdk.client"]
    assert len(messages) == 5  # one line per kind of misuse, not per occurrence
    assert any("nested" in m for m in messages)
    assert len(got) == 12  # misuse never loses the steps themselves
    never_closed = [d.step for d in got][3]
    assert never_closed.phases is not None and never_closed.phases.forward is not None
    sw.close()


def test_user_exception_inside_phase_inside_step_is_not_swallowed(absent: FakeAgent) -> None:
    sw = stepwatch.init("j", job_events=False, agent_socket=absent.path, env={})
    with pytest.raises(ZeroDivisionError), sw.step() as s, s.phase("forward"):
        _ = 1 / 0
    with sw.step():  # the SDK is still usable after an exception
        pass
    assert sw.stats()["misuse"] == {}
    sw.close()


def test_broken_event_factory_falls_back_to_wall_time(absent: FakeAgent) -> None:
    def factory() -> TimingEvent:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    absent.listen()
    sw = stepwatch.init(
        "j", job_events=False, agent_socket=absent.path, env={}, event_factory=factory
    )
    assert sw.timing == "cuda"
    run_steps(sw, 2)
    sw.flush(2.0)
    assert [d.step.timing for d in absent.steps()] == ["wall", "wall"]
    assert sw.stats()["misuse"]["cuda_record"] > 0
    sw.close()
