"""Values from user code that raised into the training loop or cost every later step.

Before: ``sw.step(step=t)`` with an index whose ``__index__`` raises other than
``TypeError`` (a tensor on the meta device: ``RuntimeError``) raised into the loop;
so did ``sw.checkpoint`` with a kind or path whose ``str()``/``__fspath__`` raises and
``sw.set_group`` with a group whose ``str()`` raises. ``sw.set_group`` with a
control character or over 256 characters made the agent refuse every later step
(``schema``) while the SDK counted them as sent, with no word of misuse.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import stepwatch
from stepwatch.sdk.client import StepWatch
from tests.support.sdk_agent import FakeAgent


@pytest.fixture()
def sw(agent: FakeAgent) -> Iterator[StepWatch]:
    handle = stepwatch.init("job-1", rank=1, world_size=2, agent_socket=agent.path, env={})
    yield handle
    handle.close()


class Unreadable:
    def __str__(self) -> str:
        raise RuntimeError("str")

    def __repr__(self) -> str:
        return "Unreadable()"

    def __fspath__(self) -> str:
        raise RuntimeError("fspath")

    def __index__(self) -> int:
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")


def test_an_unreadable_step_number_is_numbered_automatically(
    sw: StepWatch, agent: FakeAgent
) -> None:
    with sw.step(step=Unreadable()):  # type: ignore[arg-type]
        pass
    sw.flush()
    assert [s.step.step for s in agent.steps()] == [0]
    assert sw.stats()["misuse"]["bad_step"] == 1


def test_an_unreadable_checkpoint_kind_or_path_is_not_raised(
    sw: StepWatch, agent: FakeAgent
) -> None:
    sw.checkpoint(Unreadable(), duration=1.0)  # type: ignore[arg-type]
    sw.checkpoint("save", duration=1.0, path=Unreadable())
    with sw.checkpoint("load", path=Unreadable()):
        pass
    assert sw.stats()["misuse"]["internal"] == 3


def test_a_group_the_agent_would_refuse_is_sent_plain_and_counted(
    sw: StepWatch, agent: FakeAgent
) -> None:
    sw.set_group(Unreadable())  # type: ignore[arg-type]
    with sw.step():
        pass
    sw.set_group("pp\x1b[31m1")
    with sw.step():
        pass
    sw.set_group("g" * 300)
    with sw.step():
        pass
    sw.set_group("pp3")
    with sw.step():
        pass
    sw.flush()
    groups = [s.step.group for s in agent.steps()]  # decoded as the agent decodes them
    assert len(groups) == 4, sw.stats()
    assert groups[0] == "all" and groups[1] == "pp\ufffd[31m1" and groups[3] == "pp3"
    assert len(groups[2]) == 256
    assert sw.stats()["misuse"]["bad_group"] == 3
