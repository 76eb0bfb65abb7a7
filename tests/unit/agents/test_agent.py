"""The agent loop with injected clocks, fake collectors and a recording sink."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from stepwatch.agents.agent import Agent, build_collectors, collector_names
from stepwatch.agents.collectors.base import CollectorHealth, HealthState, HostContext
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.agents.metrics import registry_for, render
from stepwatch.contract import (
    GpuMessage,
    GpuReading,
    Message,
    PortMessage,
    StepRecord,
    decode,
    encode,
)
from stepwatch.contract.wire import RankStep, encode_datagram
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings

WALL0 = 1_700_000_000.3


class Clock:
    def __init__(self) -> None:
        self.mono = 100.0
        self.waits: list[float] = []

    def wall(self) -> float:
        return WALL0 + (self.mono - 100.0)

    def monotonic(self) -> float:
        return self.mono


class RecordingSink:
    def __init__(self) -> None:
        self.batches: list[list[Message]] = []
        self.calls: list[str] = []

    def send(self, messages: Sequence[Message]) -> None:
        self.batches.append(list(messages))
        self.calls.append("send")

    def flush(self, timeout: float = 10.0) -> int:
        self.calls.append("flush")
        return 0

    def close(self, timeout: float = 10.0) -> None:
        self.calls.append("close")

    @property
    def messages(self) -> list[Message]:
        return [m for b in self.batches for m in b]


class GpuCollector:
    name = "fake-gpu"

    def __init__(self, clock: Clock | None = None, cost: float = 0.0) -> None:
        self.clock, self.cost, self.closed = clock, cost, False

    def collect(self, ctx: HostContext) -> list[Message]:
        if self.clock is not None:
            self.clock.mono += self.cost
        return [
            GpuMessage(host=ctx.host, ts=ctx.now, gpus=[GpuReading(index=0)]),
            PortMessage(host="", ts=ctx.now),
        ]

    def health(self) -> CollectorHealth:
        return CollectorHealth(HealthState.OK)

    def close(self) -> None:
        self.closed = True


class Broken:
    name = "broken"

    def collect(self, ctx: HostContext) -> list[Message]:
        raise RuntimeError("sensor on fire")

    def health(self) -> CollectorHealth:
        raise RuntimeError("no health either")

    def close(self) -> None:
        raise RuntimeError("cannot even close")


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings.load(
        env={},
        host="node01",
        tick_seconds=1.0,
        collectors="steps",
        agent_socket=str(tmp_path / "a.sock"),
        spool_dir=str(tmp_path / "spool"),
    )


def agent_with(
    settings: Settings, *collectors, clock: Clock | None = None
) -> tuple[Agent, RecordingSink]:
    clock = clock or Clock()
    sink = RecordingSink()
    return Agent(settings, list(collectors), sink, clock=clock.monotonic, wall=clock.wall), sink


def test_tick_stamps_gap_free_sequence_per_kind_and_fills_host(settings: Settings) -> None:
    agent, sink = agent_with(settings, GpuCollector())
    for _ in range(3):
        assert agent.tick() == 2
    gpu = [m for m in sink.messages if isinstance(m, GpuMessage)]
    port = [m for m in sink.messages if isinstance(m, PortMessage)]
    assert [m.seq for m in gpu] == [0, 1, 2] and [m.seq for m in port] == [0, 1, 2]
    assert {m.inst for m in sink.messages} == {agent.sequencer.inst}
    assert {m.host for m in port} == {"node01"}


def test_broken_collector_is_counted_logged_once_and_the_rest_flows(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    agent, sink = agent_with(settings, Broken(), GpuCollector())
    with caplog.at_level(logging.ERROR, logger="stepwatch.agents.agent"):
        for _ in range(4):
            agent.tick()
    assert len(sink.messages) == 8
    assert agent.snapshot().collector_errors["broken"] == 4
    assert len([r for r in caplog.records if "sensor on fire" in r.getMessage()]) == 1
    assert agent.snapshot().health["broken"].state is HealthState.DOWN


class OddGpus:
    """Two GPUs, one whose driver answers an ECC count beyond the contract's ceiling."""

    name = "odd-gpu"

    def collect(self, ctx: HostContext) -> list[Message]:
        odd = GpuReading(index=1, power_w=310.0, ecc_dbe_total=2**62, temp_gpu_c=61.0)
        return [GpuMessage(host=ctx.host, ts=ctx.now, gpus=[GpuReading(index=0), odd])]

    def health(self) -> CollectorHealth:
        return CollectorHealth(HealthState.OK)

    def close(self) -> None:
        pass


def test_a_value_beyond_the_contract_costs_that_value_not_the_hosts_message(
    settings: Settings,
) -> None:
    """The worker and the sink refuse a message with one value beyond a ceiling: one GPU's
    odd ECC count cost every GPU of the host its samples."""
    agent, sink = agent_with(settings, OddGpus())
    agent.tick()
    agent.tick()
    (first, _) = sink.messages
    decoded = decode(encode(first))  # what the consumers read, with their checks
    assert isinstance(decoded, GpuMessage) and [g.index for g in decoded.gpus] == [0, 1]
    odd = decoded.gpus[1]
    assert odd.ecc_dbe_total is None and (odd.power_w, odd.temp_gpu_c) == (310.0, 61.0)
    assert agent.snapshot().values_left_out == {"ecc_dbe_total": 2}
    text = render(registry_for(agent.snapshot, process=False))
    assert 'stepwatch_agent_values_left_out_total{field="ecc_dbe_total"} 2.0' in text


def test_host_samples_keyed_by_the_job_the_steps_name(settings: Settings) -> None:
    steps = StepsCollector(settings.agent_socket, clock=lambda: WALL0)
    try:
        agent, sink = agent_with(settings, GpuCollector(), steps)
        assert agent.collectors[0] is steps  # polled first
        rec = StepRecord(
            job_id="llama", rank=3, world_size=8, step=1, start=WALL0 - 1, end=WALL0, local_rank=3
        )
        steps.feed(encode_datagram(RankStep(step=rec)))
        agent.tick()
        gpu = next(m for m in sink.messages if isinstance(m, GpuMessage))
        assert gpu.job_id == "llama"  # learned from the steps of the same tick
        assert [m.job_id for m in sink.messages if type(m).__name__ == "StepMessage"] == ["llama"]
    finally:
        steps.close()


def test_a_datagram_that_is_not_utf8_is_rejected_and_the_others_kept(settings: Settings) -> None:
    """One flipped byte in a job id (not UTF-8) is a rejected datagram, counted; the
    datagrams around it in the same tick still become step records."""
    steps = StepsCollector(settings.agent_socket, clock=lambda: WALL0)
    try:
        agent, sink = agent_with(settings, steps)
        for rank in range(3):
            rec = StepRecord(
                job_id="llama", rank=rank, world_size=8, step=1, start=WALL0 - 1, end=WALL0
            )
            data = encode_datagram(RankStep(step=rec))
            steps.feed(data.replace(b'"llama"', b'"ll\xffma"') if rank == 1 else data)
        agent.tick()
        assert steps.rejected["malformed_json"] == 1
        sent = [r.rank for m in sink.messages if type(m).__name__ == "StepMessage" for r in m.steps]  # type: ignore[attr-defined]
        assert sorted(sent) == [0, 2]
    finally:
        steps.close()


def test_no_job_attribution_when_two_jobs_share_the_host(settings: Settings) -> None:
    steps = StepsCollector(settings.agent_socket, clock=lambda: WALL0)
    try:
        agent, sink = agent_with(settings, GpuCollector(), steps)
        for job, gpu in (("a", 0), ("b", 1)):
            rec = StepRecord(
                job_id=job, rank=0, world_size=1, step=1, start=WALL0 - 1, end=WALL0, gpu=gpu
            )
            steps.feed(encode_datagram(RankStep(step=rec)))
        agent.tick()
        gpu_msg = next(m for m in sink.messages if isinstance(m, GpuMessage))
        assert gpu_msg.job_id is None
    finally:
        steps.close()


def test_run_ticks_aligned_then_shuts_down_cleanly(settings: Settings) -> None:
    clock = Clock()
    gpu = GpuCollector()
    agent, sink = agent_with(settings, gpu, clock=clock)
    stop = threading.Event()
    ticks_at: list[float] = []
    real_tick = agent.tick

    def tick() -> int:
        ticks_at.append(clock.wall())
        return real_tick()

    agent.tick = tick  # type: ignore[method-assign]

    def wait(delay: float) -> bool:
        clock.waits.append(delay)
        clock.mono += delay
        if len(ticks_at) >= 4:
            stop.set()
        return stop.is_set()

    agent.run(stop, wait=wait)
    assert clock.waits[0] == pytest.approx(0.7)  # to the next whole second of wall time
    assert ticks_at[:4] == pytest.approx([WALL0 + 0.7 + i for i in range(4)], abs=1e-6)
    assert len(ticks_at) == 5  # four in the loop, one final tick at shutdown
    assert sink.calls[-2:] == ["flush", "close"] and gpu.closed
    assert not agent.ready


def test_slow_ticks_are_skipped_and_counted(settings: Settings) -> None:
    clock = Clock()
    agent, _ = agent_with(settings, GpuCollector(clock, cost=2.5), clock=clock)
    stop = threading.Event()

    def wait(delay: float) -> bool:
        clock.waits.append(delay)
        clock.mono += delay
        if agent.ticks >= 3:
            stop.set()
        return stop.is_set()

    agent.run(stop, wait=wait)
    assert agent.overruns == 6  # each 2.5 s tick misses two 1 s slots
    assert all(w == pytest.approx(0.5) for w in clock.waits[1:])  # back on the grid


def test_close_errors_do_not_stop_shutdown(settings: Settings) -> None:
    agent, sink = agent_with(settings, Broken(), GpuCollector())
    agent.shutdown(timeout=0.1)
    assert sink.calls[-1] == "close"


def test_metrics_expose_agent_state_with_prometheus_names(settings: Settings) -> None:
    agent, _ = agent_with(settings, Broken(), GpuCollector())
    agent.tick()
    text = render(registry_for(agent.snapshot, process=False))
    assert 'stepwatch_agent_collector_state{collector="broken",state="down"} 1.0' in text
    assert 'stepwatch_agent_collector_state{collector="fake-gpu",state="ok"} 1.0' in text
    assert 'stepwatch_agent_collector_errors_total{collector="broken"} 1.0' in text
    assert 'stepwatch_agent_messages_total{kind="gpu"} 1.0' in text
    assert "stepwatch_agent_ready 0.0" in text and "stepwatch_agent_up 1.0" in text
    assert "stepwatch_agent_last_tick_duration_seconds" in text
    for line in text.splitlines():
        if line.startswith("# TYPE") and line.endswith("counter"):
            assert line.split()[2].startswith("stepwatch_agent_")


def test_collector_names_and_building(settings: Settings) -> None:
    assert collector_names(" Steps, nvml,,steps ") == ["steps", "nvml"]
    assert collector_names("none") == []
    built = build_collectors(settings.replace(collectors="steps"))
    try:
        assert [type(c) for c in built] == [StepsCollector]
    finally:
        for c in built:
            c.close()
    with pytest.raises(ConfigError):
        build_collectors(settings.replace(collectors="steps,warp-drive"))


def test_a_rank_process_that_ends_unannounced_is_sent_and_counted(settings: Settings) -> None:
    """The exit watch's rank_exit goes out with the tick's messages, and /metrics counts
    the processes watched and the exits told (collectors/exits.py)."""
    import os
    import subprocess
    import sys
    import time

    from stepwatch.agents.collectors.exits import GRACE_SECONDS
    from stepwatch.agents.collectors.procfs import ProcFS
    from stepwatch.contract import EventMessage, EventType

    if not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfds on this system")
    steps = StepsCollector(settings.agent_socket)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        agent, sink = agent_with(settings, steps)
        start = ProcFS().start_time(rank.pid)
        assert start is not None
        steps.exits.watch(rank.pid, start, "llama", 5, 5, 12)
        text = render(registry_for(agent.snapshot, process=False))
        assert "stepwatch_agent_rank_processes_watched 1.0" in text
        deadline = time.monotonic() + 5
        while not steps.exits.listening and time.monotonic() < deadline:
            time.sleep(0.02)  # where this test may listen to the kernel's process events
        listening = 1.0 if steps.exits.listening else 0.0
        text = render(registry_for(agent.snapshot, process=False))
        assert f"stepwatch_agent_rank_exit_events_listening {listening}" in text
        rank.kill()
        rank.wait()
        deadline = time.monotonic() + 5
        while steps.exits.watched and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(GRACE_SECONDS + 0.1)
        agent.tick()
        exits = [m for m in sink.messages if isinstance(m, EventMessage)]
        assert [(e.type, e.job_id, e.rank, e.host) for e in exits] == [
            (EventType.RANK_EXIT, "llama", 5, "node01")
        ]
        text = render(registry_for(agent.snapshot, process=False))
        assert "stepwatch_agent_rank_exits_total 1.0" in text
        assert "stepwatch_agent_rank_processes_watched 0.0" in text
    finally:
        rank.kill()
        rank.wait()
        steps.close()
