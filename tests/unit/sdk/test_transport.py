"""The datagram sender and the wire format over a real Unix datagram socket."""

from __future__ import annotations

import math
import time

import pytest

from stepwatch.contract.records import EventType, Phases, StepRecord
from stepwatch.contract.wire import (
    MAX_DATAGRAM_BYTES,
    RankEvent,
    RankStep,
    decode_datagram,
    encode_datagram,
)
from stepwatch.errors import ContractError
from stepwatch.sdk.transport import DatagramSender
from tests.support.sdk_agent import FakeAgent

RECORD = StepRecord(
    job_id="job-1",
    rank=5,
    world_size=16,
    step=42,
    start=1.7e9,
    end=1.7e9 + 0.8,
    host="n3",
    local_rank=5,
    gpu=5,
    group="pp1",
    phases=Phases(
        data=0.01,
        forward=0.2,
        backward=0.4,
        optimizer=0.05,
        comm_wait=0.14,
        extra={"embedding-grads-sync": 0.003},
    ),
    samples=32,
    tokens=131072,
    loss=2.5,
    flops=3.1e14,
    timing="cuda",
)


def test_round_trip_through_a_real_socket(agent: FakeAgent) -> None:
    sender = DatagramSender(agent.path)
    event = RankEvent(
        type=EventType.EXCEPTION,
        ts=1.7e9,
        job_id="job-1",
        rank=5,
        gpu=5,
        detail="OOM",
        attrs={"step": 42, "oom": True, "message": "CUDA out of memory"},
    )
    assert sender.send(RankStep(step=RECORD)) and sender.send(event)
    assert agent.receive() == [RankStep(step=RECORD), event]
    assert sender.sent == 2 and not sender.dropped


def test_datagram_format_is_the_documented_one(agent: FakeAgent) -> None:
    DatagramSender(agent.path).send(RankStep(step=RECORD))
    assert agent.sock is not None
    raw = agent.sock.recv(65536)
    assert raw.startswith(b'{"kind":"rank_step","step":{"job_id":"job-1","rank":5')
    assert raw.endswith(b',"timing":"cuda"},"v":1}')


def test_oversized_datagrams_are_dropped_not_sent(agent: FakeAgent) -> None:
    sender = DatagramSender(agent.path)
    big = RankEvent(type=EventType.RESTART, ts=1.7e9, job_id="j", detail="x" * MAX_DATAGRAM_BYTES)
    assert not sender.send(big)
    assert sender.dropped == {"oversized": 1}
    assert agent.receive(timeout=0.05) == []


def test_no_agent_is_counted() -> None:
    absent = FakeAgent(listen=False)
    sender = DatagramSender(absent.path)
    assert not sender.send(RankStep(step=RECORD))
    assert (sender.held, sender.dropped) == (1, {})  # held for an agent that may come
    sender.close()
    assert sender.dropped == {"no_agent": 1}
    absent.close()


def test_full_agent_queue_drops_without_waiting_when_no_budget(agent: FakeAgent) -> None:
    sender = DatagramSender(agent.path)
    results = [sender.send(RankStep(step=RECORD)) for _ in range(300)]
    assert not all(results)  # the receiver never read: its queue filled up
    assert sender.sent + sender.held == 300
    assert sender.retries == 0
    assert len(agent.receive()) == sender.sent
    sender.close()  # the queue has room again: some held go now, the rest are counted
    assert sender.sent + sender.dropped["buffer_full"] == 300


def test_full_agent_queue_is_retried_within_the_budget(agent: FakeAgent) -> None:
    sender = DatagramSender(agent.path)
    while sender.send(RankStep(step=RECORD)):
        pass  # fill the queue
    sender.allow_wait(0.01)
    t0 = time.monotonic()
    assert not sender.send(RankStep(step=RECORD))
    assert sender.retries > 0
    assert time.monotonic() - t0 < 1.0  # bounded by the budget, never blocked on the socket


def test_closed_sender_counts_instead_of_raising(agent: FakeAgent) -> None:
    sender = DatagramSender(agent.path)
    sender.close()
    assert not sender.send(RankStep(step=RECORD))
    assert sender.dropped == {"no_socket": 1}


def test_unencodable_value_is_dropped() -> None:
    sender = DatagramSender("/nonexistent/agent.sock")
    bad = RankEvent(type=EventType.RESTART, ts=1.7e9, job_id="j", attrs={"x": object()})  # type: ignore[dict-item]
    assert not sender.send(bad)
    assert sender.dropped == {"encode": 1}


def test_a_steps_timing_follows_the_name_rule() -> None:
    """An unchecked string: 12 KB with ANSI escapes and a forged log line went to Kafka."""
    rec = StepRecord(
        job_id="j", rank=0, world_size=1, step=0, start=1.7e9, end=1.7e9 + 1, timing="cuda"
    )
    assert decode_datagram(encode_datagram(RankStep(step=rec))).step.timing == "cuda"  # type: ignore[union-attr]
    bad = encode_datagram(RankStep(step=rec)).replace(b'"cuda"', b'"\\u001b[2Jcuda\\nlevel=ERROR"')
    with pytest.raises(ContractError) as info:
        decode_datagram(bad)
    assert info.value.reason == "schema" and "timing" in info.value.detail


def test_nan_never_reaches_the_wire_as_a_number() -> None:
    data = RankStep(
        step=StepRecord(
            job_id="j",
            rank=0,
            world_size=1,
            step=0,
            start=1.7e9,
            end=1.7e9 + 1,
            loss=None,
            loss_nonfinite=True,
        )
    )
    back = decode_datagram(encode_datagram(data))
    assert isinstance(back, RankStep) and back.step.loss_nonfinite and back.step.loss is None
    assert not math.isnan(back.step.end)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json", "malformed_json"),
        (b'{"kind":"rank_nope","v":1}', "schema"),
        (b'{"kind":"rank_event","type":"xid","ts":1.0,"job_id":"j","v":2}', "unsupported_version"),
        (b"x" * (MAX_DATAGRAM_BYTES + 1), "schema"),
        # the host's hardware is the agent's collectors' to report: one forged XID 79 paged
        # GpuXidFatal (remediation: drain), under --verify-job strict too
        (b'{"kind":"rank_event","type":"xid","ts":1,"job_id":"j","gpu":5,"code":79}', "host_fact"),
        (b'{"kind":"rank_event","type":"ecc","ts":1.0,"job_id":"j","gpu":0}', "host_fact"),
        (b'{"kind":"rank_event","type":"link_state","ts":1.0,"job_id":"j"}', "host_fact"),
        # the contract's bounds: the worker and the sink refuse these (absurd_value, overflow)
        (b'{"kind":"rank_event","type":"exception","ts":1.0,"job_id":"j","rank":-3}', "schema"),
        (b'{"kind":"rank_event","type":"restart","ts":1,"job_id":"j","rank":4294967296}', "schema"),
        (b'{"kind":"rank_event","type":"restart","ts":1.0,"job_id":"j","gpu":65536}', "schema"),
    ],
)
def test_decode_rejects_what_is_not_a_datagram(data: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as info:
        decode_datagram(data)
    assert info.value.reason == reason
