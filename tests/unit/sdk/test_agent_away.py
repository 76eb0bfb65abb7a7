"""An agent that is away for a while (restart, upgrade, SIGSTOP) costs no steps.

Red team: four real ranks at 100 steps/s through a 3 s agent restart (SIGTERM,
start again) each had ~300 of 800 steps dropped as `no_agent`; a 8 s SIGSTOP cost
one rank 770 of 1,500 steps (`buffer_full`). Now the SDK holds what the agent did
not take (bounded), in order, and resends it, no faster than the agent admits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from stepwatch.contract.records import StepRecord
from stepwatch.contract.wire import RankStep
from stepwatch.sdk import transport
from stepwatch.sdk.transport import RESEND_BURST, DatagramSender
from tests.support.sdk_agent import FakeAgent

pytestmark = pytest.mark.unit


def step(n: int) -> RankStep:
    return RankStep(
        step=StepRecord(job_id="j", rank=0, world_size=1, step=n, start=1.7e9, end=1.7e9 + 1)
    )


@pytest.fixture()
def away() -> Iterator[FakeAgent]:
    fake = FakeAgent(listen=False)
    yield fake
    fake.close()


def steps_of(agent: FakeAgent) -> list[int]:
    return [d.step.step for d in agent.steps()]


def test_steps_sent_while_the_agent_was_away_arrive_once_in_order(away: FakeAgent) -> None:
    sender = DatagramSender(away.path)
    for n in range(5):
        assert not sender.send(step(n))  # nobody listens: held, not dropped
    assert (sender.sent, sender.held, dict(sender.dropped)) == (0, 5, {})
    away.listen()  # the agent is back
    sender.send(step(5))  # queued behind the held ones, never ahead of them
    sender.close()
    assert steps_of(away) == [0, 1, 2, 3, 4, 5]
    assert (sender.sent, dict(sender.dropped)) == (6, {})


def test_the_backlog_is_resent_no_faster_than_the_agent_admits(away: FakeAgent) -> None:
    sender = DatagramSender(away.path)
    for n in range(100):
        sender.send(step(n))
    away.listen()
    went = sender.resend()
    assert 0 < went <= RESEND_BURST  # the agent's per-process burst is never exceeded
    assert sender.held == 100 - went
    assert steps_of(away) == list(range(went))
    sender.close()


def test_an_agent_away_too_long_costs_the_oldest_counted(
    away: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "HOLD_MAX", 10)
    sender = DatagramSender(away.path)
    for n in range(25):
        sender.send(step(n))
    assert sender.held == 10 and sender.dropped == {"no_agent": 15}
    away.listen()
    while sender.held:
        if not sender.resend():
            time.sleep(0.01)  # the resend rate refills
    sender.close()
    assert steps_of(away) == list(range(15, 25))
    assert sender.sent + sum(sender.dropped.values()) == 25
