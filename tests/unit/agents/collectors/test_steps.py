"""The steps collector on a real Unix datagram socket: decoding, garbage, GPU ownership."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepwatch.agents.collectors.base import HealthState, HostContext
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import EventMessage, EventType, StepMessage, StepRecord
from stepwatch.contract.wire import RankEvent, RankStep, encode_datagram
from stepwatch.errors import CollectorError

NOW = 1_700_000_000.0


def step(
    job: str,
    rank: int,
    n: int = 0,
    *,
    gpu: int | None = None,
    host: str = "",
    start: float = NOW - 1.0,
) -> bytes:
    record = StepRecord(
        job_id=job,
        rank=rank,
        world_size=16,
        step=n,
        start=start,
        end=NOW,
        local_rank=rank % 8,
        gpu=gpu,
        host=host,
    )
    return encode_datagram(RankStep(step=record))


@pytest.fixture()
def path(tmp_path: Path) -> str:
    return str(tmp_path / "run" / "agent.sock")  # parent directory does not exist yet


@pytest.fixture()
def collector(path: str) -> Iterator[StepsCollector]:
    c = StepsCollector(path, clock=lambda: NOW)
    yield c
    c.close()


def send(path: str, *datagrams: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, path)


def collect(c: StepsCollector, now: float = NOW, expect: int = 0) -> list:
    deadline = time.monotonic() + 5
    while len(c._buf) < expect and time.monotonic() < deadline:  # the reader thread is async
        time.sleep(0.005)
    return c.collect(HostContext("node07", now, {}))


def test_steps_grouped_per_job_with_host_stamped(collector: StepsCollector, path: str) -> None:
    send(
        path,
        step("a", 0),
        step("a", 1),
        step("b", 8, host="node07"),
        step("c", 9, host="elsewhere"),
    )
    out = collect(collector, expect=4)
    by_job = {m.job_id: m for m in out if isinstance(m, StepMessage)}
    assert set(by_job) == {"a", "b"}  # c claims another host: rejected, never forwarded
    assert [r.rank for r in by_job["a"].steps] == [0, 1]
    assert {r.host for r in by_job["a"].steps} == {"node07"}  # missing host stamped
    assert by_job["b"].steps[0].host == "node07"
    assert collector.rejected["host_mismatch"] == 1
    assert all(m.host == "node07" and m.ts == NOW for m in out)
    assert collector.steps_received == 3
    assert collect(collector) == []  # drained


def test_rank_event_becomes_event_message(collector: StepsCollector, path: str) -> None:
    event = RankEvent(
        type=EventType.EXCEPTION,
        ts=NOW - 2,
        job_id="a",
        rank=3,
        gpu=3,
        detail="CUDA out of memory",
        attrs={"step": 12},
    )
    send(path, encode_datagram(event))
    (msg,) = collect(collector, expect=1)
    assert isinstance(msg, EventMessage)
    assert (msg.type, msg.job_id, msg.rank, msg.gpu, msg.ts) == (
        EventType.EXCEPTION,
        "a",
        3,
        3,
        NOW - 2,
    )
    assert msg.attrs == {"step": 12} and msg.host == "node07"


def test_garbage_is_counted_by_reason_and_the_rest_flows(
    collector: StepsCollector, path: str
) -> None:
    send(
        path,
        b"not json at all",
        b'{"kind": "rank_step", "v": 1}',  # schema: no step
        b'{"kind": "rank_step", "v": 9, "step": {}}',
        step("a", 0, start=NOW + 5),  # ends before it starts: absurd
        step("a", 1),
    )
    out = collect(collector, expect=5)
    assert [r.rank for m in out for r in m.steps] == [1]
    assert collector.rejected["malformed_json"] == 1
    assert collector.rejected["absurd_value"] == 1
    assert collector.rejected["schema"] + collector.rejected["unsupported_version"] == 2
    assert collector.health().state is HealthState.DEGRADED
    assert collector.health().state is HealthState.OK  # no new garbage since


def test_bounded_buffer_drops_and_counts(path: str) -> None:
    c = StepsCollector(path, max_buffered=5, clock=lambda: NOW)
    try:
        send(path, *[step("a", r) for r in range(8)])
        deadline = time.monotonic() + 5
        while c._overflow < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        out = c.collect(HostContext("h", NOW, {}))
        assert isinstance(out[0], StepMessage) and len(out[0].steps) == 5
        assert c.rejected["buffer_full"] == 3
    finally:
        c.close()


def test_gpu_ownership_from_gpu_or_local_rank(collector: StepsCollector, path: str) -> None:
    send(path, step("a", 0, gpu=4), step("a", 9))  # rank 9: local_rank 1, no gpu field
    collect(collector, expect=2)
    assert collector.owners() == {4: ("a", 0), 1: ("a", 9)}
    assert collector.job_of_gpu() == {4: "a", 1: "a"}
    send(path, encode_datagram(RankEvent(type=EventType.JOB_END, ts=NOW, job_id="a", code=1)))
    (end,) = collect(collector, expect=1)
    assert collector.job_of_gpu() == {}
    assert isinstance(end, EventMessage) and end.code == 1  # the exit code travels on


def test_gpu_ownership_expires(collector: StepsCollector, path: str) -> None:
    send(path, step("a", 0))
    collect(collector, expect=1)
    collect(collector, now=NOW + 3600)
    assert collector.job_of_gpu() == {}


def test_stale_socket_is_replaced(path: str) -> None:
    Path(path).parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(path)
    stale.close()  # the file stays behind, nobody listens
    c = StepsCollector(path, clock=lambda: NOW)
    try:
        send(path, step("a", 0))
        assert len(collect(c, expect=1)) == 1
    finally:
        c.close()
    assert not Path(path).exists()  # removed on close


def test_live_socket_and_regular_file_are_not_taken_over(path: str) -> None:
    first = StepsCollector(path, clock=lambda: NOW)
    try:
        second = StepsCollector(path, clock=lambda: NOW)
        assert second.health().state is HealthState.DOWN
        assert "another process" in second.health().last_error
        assert second.collect(HostContext("h", NOW, {})) == []
    finally:
        first.close()
    Path(path).write_text("precious")
    third = StepsCollector(path, clock=lambda: NOW)
    assert third.health().state is HealthState.DOWN
    assert Path(path).read_text() == "precious"


def test_bind_socket_refuses_non_socket(tmp_path: Path) -> None:
    from stepwatch.agents.collectors.steps import _bind_socket

    target = tmp_path / "f"
    target.write_text("x")
    with pytest.raises(CollectorError):
        _bind_socket(str(target), 0o600)


def test_a_step_stamped_outside_the_workers_window_is_refused_alone(
    collector: StepsCollector,
) -> None:
    """Before, one record of job a stamped two days back (or 200 s ahead) went into job a's
    message from this host, and the stream worker refused the whole message as too_old
    (future_timestamp): every honest record of job a in that tick was lost with it."""
    old = StepRecord(job_id="a", rank=5, world_size=16, step=0, start=NOW - 2 * 86400,
                     end=NOW - 2 * 86400 + 1)  # fmt: skip
    ahead = StepRecord(job_id="a", rank=6, world_size=16, step=0, start=NOW + 199, end=NOW + 200)
    for d in (step("a", 0), encode_datagram(RankStep(step=old)),
              encode_datagram(RankStep(step=ahead)), step("a", 1)):  # fmt: skip
        collector.feed(d)
    (msg,) = collect(collector)
    assert isinstance(msg, StepMessage) and [r.rank for r in msg.steps] == [0, 1]
    assert collector.rejected["step_time_window"] == 2


def test_a_rank_stamping_with_a_clock_since_boot_is_refused_at_the_socket(
    collector: StepsCollector,
) -> None:
    """time.monotonic() where time.time() belongs: the event went on to the store, which
    filed it under 1970-01-02 (the worker refused it as too old)."""
    boot = RankEvent(type=EventType.CHECKPOINT_SAVE, ts=86400.0, job_id="a", rank=0)
    since_boot = StepRecord(job_id="a", rank=1, world_size=16, step=0, start=86400.0, end=86401.0)
    for d in (encode_datagram(boot), encode_datagram(RankStep(step=since_boot)), step("a", 0)):
        collector.feed(d)
    (msg,) = collect(collector)
    assert isinstance(msg, StepMessage) and [r.rank for r in msg.steps] == [0]
    assert collector.rejected["absurd_value"] == 1  # the event: the contract's reason
    assert collector.rejected["schema"] == 1  # the step: its fields' types and floors
