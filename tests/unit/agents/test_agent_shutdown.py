"""The agent's shutdown on a real step socket: every datagram a rank's SDK counts as
sent is spooled, whatever the flush does; the successor agent's socket is left alone.

Red team: with Kafka down, SIGTERM ran a final tick, then waited up to 10 s in the
flush with the socket still bound. The ranks' SDKs kept handing datagrams to it
(3,002 counted as sent by two ranks, 0 dropped) and the agent spooled 1,128: the
rest landed in a buffer nobody collected again. With Kafka up the same happened in
the flush's few tens of milliseconds (32 of 1,991 steps).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from stepwatch.agents.agent import Agent
from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import Message, StepMessage, StepRecord
from stepwatch.contract.wire import RankStep, encode_datagram
from stepwatch.sdk.transport import DatagramSender
from stepwatch.settings import Settings

pytestmark = pytest.mark.unit

NOW = time.time()


def datagram(n: int) -> bytes:
    rec = StepRecord(job_id="j1", rank=0, world_size=2, step=n, start=NOW - 1, end=NOW)
    return encode_datagram(RankStep(step=rec))


class SlowFlushSink:
    """A sink whose flush runs ``during_flush`` (the seconds a real flush waits for Kafka)."""

    def __init__(self, during_flush: Callable[[], None]) -> None:
        self.messages: list[Message] = []
        self._during_flush = during_flush

    def send(self, messages: Sequence[Message]) -> None:
        self.messages.extend(messages)

    def flush(self, timeout: float = 10.0) -> int:
        self._during_flush()
        return 0

    def close(self, timeout: float = 10.0) -> None:
        pass

    def steps(self) -> list[int]:
        return sorted(s.step for m in self.messages if isinstance(m, StepMessage) for s in m.steps)


def settings_for(tmp_path: Path) -> Settings:
    return Settings.load(
        env={}, host="node01", collectors="steps", agent_socket=str(tmp_path / "s" / "a.sock")
    )


def test_every_datagram_the_sdk_counts_as_sent_is_spooled_at_shutdown(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    collector = StepsCollector(settings.agent_socket)
    rank = DatagramSender(settings.agent_socket)

    def rank_sends_while_the_agent_flushes() -> None:
        for n in range(100, 110):
            rank.send_bytes(datagram(n))

    sink = SlowFlushSink(rank_sends_while_the_agent_flushes)
    agent = Agent(settings, [collector], sink)
    for n in range(8):  # queued in the kernel (or the reader's buffer) before the stop
        assert rank.send_bytes(datagram(n))
    agent.shutdown(timeout=0.1)
    rank.close()

    spooled = sink.steps()
    assert len(spooled) == rank.sent, (spooled, rank.sent, dict(rank.dropped))
    assert spooled == list(range(8))
    assert rank.dropped["no_agent"] == 10  # counted by the rank, not lost unseen
    assert not os.path.exists(settings.agent_socket)


def test_a_send_in_flight_at_the_stop_is_read_or_refused_never_lost(tmp_path: Path) -> None:
    collector = StepsCollector(str(tmp_path / "s" / "a.sock"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rank:
        rank.connect(collector.path)  # resolved before the unlink, like a send in flight
        rank.send(datagram(0))
        rank.send(datagram(1))
        collector.stop_intake()
        with pytest.raises(OSError):
            rank.send(datagram(2))  # refused: the SDK counts it, never as sent
    steps = collector.collect(HostContext("node01", NOW, {}))
    collector.close()
    assert [s.step for m in steps if isinstance(m, StepMessage) for s in m.steps] == [0, 1]
    assert sum(collector.rejected.values()) == 0  # the wake-up is no record


def test_a_stopping_agent_leaves_its_successors_socket_alone(tmp_path: Path) -> None:
    path = str(tmp_path / "s" / "a.sock")
    old = StepsCollector(path)
    old.stop_intake()  # the old agent flushes (up to 10 s) ...
    new = StepsCollector(path)  # ... while its successor starts on the same path
    assert new._sock is not None
    old.close()
    try:
        assert os.path.exists(path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rank:
            rank.sendto(datagram(5), path)
        deadline = time.monotonic() + 5
        while not new._buf and time.monotonic() < deadline:
            time.sleep(0.005)
        got = new.collect(HostContext("node01", NOW, {}))
        assert [s.step for m in got if isinstance(m, StepMessage) for s in m.steps] == [5]
    finally:
        new.close()
