"""The CUDA-event timing path, driven by a fake that behaves like torch.cuda.Event.

The fake device has its own clock (advanced by the test inside each phase, as
kernels would take GPU time while the CPU returns at once) and completes events
only when the test says the GPU has caught up, so the tests see that durations
come from the events, that nothing is read before the GPU passed the events,
and that the training thread never queries or times an event.
"""

from __future__ import annotations

import math
import sys
import threading
import types

import pytest

import stepwatch
from stepwatch.sdk.cuda import torch_event_factory
from tests.support.sdk_agent import FakeAgent


class FakeGpu:
    def __init__(self) -> None:
        self.now_ms = 0.0
        self.done_ms = -math.inf  # the GPU has completed everything recorded before this
        self.created = 0
        self.calls: list[tuple[str, int]] = []

    def run(self, ms: float) -> None:
        """Work enqueued on the stream: it will take ``ms`` of GPU time."""
        self.now_ms += ms

    def catch_up(self) -> None:
        self.done_ms = math.inf

    def factory(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu, enable_timing: bool = True) -> None:
        self.gpu = gpu
        self.at: float | None = None

    def record(self) -> None:
        self.gpu.calls.append(("record", threading.get_ident()))
        self.at = self.gpu.now_ms

    def query(self) -> bool:
        self.gpu.calls.append(("query", threading.get_ident()))
        return self.at is not None and self.at <= self.gpu.done_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        self.gpu.calls.append(("elapsed_time", threading.get_ident()))
        if not (self.query() and end.query()):
            raise RuntimeError("event not completed")  # what torch does
        assert self.at is not None and end.at is not None
        return end.at - self.at


def gpu_step(sw: stepwatch.StepWatch, gpu: FakeGpu) -> None:
    with sw.step(samples=8) as s:
        with s.phase("data"):
            gpu.run(1.0)
        with s.phase("forward"):
            gpu.run(30.0)
        with s.phase("backward"):
            gpu.run(60.0)
        with s.phase("all-grads-sync"):
            gpu.run(9.0)


def test_phases_come_from_events_resolved_later_off_the_training_thread(agent: FakeAgent) -> None:
    gpu = FakeGpu()
    sw = stepwatch.init(
        "j",
        job_events=False,
        agent_socket=agent.path,
        env={},
        event_factory=gpu.factory,
        flush_interval=0.01,
    )
    assert sw.timing == "cuda"
    gpu_step(sw, gpu)
    assert not sw.flush(0.1)  # the GPU has not reached the events: nothing is sent yet
    assert sw.sent == 0 and agent.receive(timeout=0.05) == []
    gpu.catch_up()
    assert sw.flush(2.0)
    (got,) = agent.steps()
    record = got.step
    assert record.timing == "cuda"
    assert record.phases is not None
    assert record.phases.data == pytest.approx(0.001)
    assert record.phases.forward == pytest.approx(0.030)
    assert record.phases.backward == pytest.approx(0.060)
    assert record.phases.comm_wait == pytest.approx(0.009)
    assert record.end - record.start == pytest.approx(0.100, abs=1e-6)
    main = threading.get_ident()
    on_main = {name for name, thread in gpu.calls if thread == main}
    assert on_main == {"record"}  # no query, no elapsed_time, no sync on the training thread
    sw.close()


def test_events_are_reused_once_resolved(agent: FakeAgent) -> None:
    gpu = FakeGpu()
    gpu.catch_up()
    sw = stepwatch.init(
        "j",
        job_events=False,
        agent_socket=agent.path,
        env={},
        event_factory=gpu.factory,
        flush_interval=0.01,
    )
    for _ in range(5):
        gpu_step(sw, gpu)
        sw.flush(2.0)
        agent.receive(timeout=0.01)
    assert sw.sent == 5
    assert gpu.created <= 2 * 10  # 10 events a step, recycled: not 50
    sw.close()


def test_events_that_never_complete_are_dropped_at_close(agent: FakeAgent) -> None:
    gpu = FakeGpu()  # a hung GPU: nothing completes
    sw = stepwatch.init(
        "j",
        job_events=False,
        agent_socket=agent.path,
        env={},
        event_factory=gpu.factory,
        flush_interval=0.01,
    )
    gpu_step(sw, gpu)
    gpu_step(sw, gpu)
    sw.close(timeout=0.2)  # returns: the training process is never held up
    assert sw.sent == 0
    assert sw.stats()["dropped_by"] == {"cuda_pending": 2}


def test_an_untimeable_event_falls_back_to_wall_time(agent: FakeAgent) -> None:
    gpu = FakeGpu()
    gpu.catch_up()

    class Broken(FakeEvent):
        def elapsed_time(self, end: FakeEvent) -> float:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")

    sw = stepwatch.init(
        "j",
        job_events=False,
        agent_socket=agent.path,
        env={},
        event_factory=lambda: Broken(gpu),
        flush_interval=0.01,
    )
    gpu_step(sw, gpu)
    sw.flush(2.0)
    (got,) = agent.steps()
    assert got.step.timing == "wall" and got.step.phases is not None
    sw.close()


def test_auto_timing_uses_torch_only_when_already_imported(
    agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torch_event_factory() is None
    plain = stepwatch.init("j", job_events=False, agent_socket=agent.path, env={})
    assert plain.timing == "wall"
    plain.close()

    gpu = FakeGpu()
    gpu.catch_up()
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True,
        Event=lambda enable_timing=False: FakeEvent(gpu, enable_timing),
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    sw = stepwatch.init("j", job_events=False, agent_socket=agent.path, env={}, flush_interval=0.01)
    assert sw.timing == "cuda"
    gpu_step(sw, gpu)
    sw.flush(2.0)
    assert agent.steps()[0].step.timing == "cuda"
    sw.close()
    wall = stepwatch.init(
        "j", job_events=False, agent_socket=agent.path, env={"STEPWATCH_TIMING": "wall"}
    )
    assert wall.timing == "wall"  # the environment overrides auto-detection
    wall.close()
    fake_torch.cuda.is_available = lambda: False  # type: ignore[attr-defined]
    assert torch_event_factory() is None
