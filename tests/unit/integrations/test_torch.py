"""The torch integration: splitting DDP's hidden wait out of backward.

The splitter is pure Python and tested with marks (and fake CUDA events); the
DDP hook is tested with a real one-process gloo DDP model when torch is
installed. Nothing the integration does may raise into training.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from time import perf_counter_ns
from typing import Any

import pytest

import stepwatch
from stepwatch.errors import MissingDependencyError, StepwatchError
from stepwatch.integrations.torch import INSTALL_HINT, require_torch
from stepwatch.integrations.torch.split import WaitSplitter
from tests.support.sdk_agent import FakeAgent
from tests.unit.sdk.test_cuda import FakeGpu

MS = 1_000_000


@pytest.fixture()
def agent() -> Iterator[FakeAgent]:
    fake = FakeAgent()
    yield fake
    fake.close()


def test_backward_splits_at_the_last_launch() -> None:
    splitter = WaitSplitter()
    spans: list[Any] = [
        ("forward", 0, 10 * MS, None, None),
        ("backward", 10 * MS, 40 * MS, None, None),
        ("optimizer", 40 * MS, 42 * MS, None, None),
    ]
    splitter.launched(15 * MS, None)
    splitter.launched(25 * MS, None)  # the last bucket: own compute ends here
    splitter(spans, 7)
    assert spans == [
        ("forward", 0, 10 * MS, None, None),
        ("backward", 10 * MS, 25 * MS, None, None),
        ("comm_wait", 25 * MS, 40 * MS, None, None),
        ("optimizer", 40 * MS, 42 * MS, None, None),
    ]
    assert splitter.stats.split == 1 and splitter.stats.unmatched == 0


def test_each_accumulation_backward_splits_and_stray_launches_are_counted() -> None:
    splitter = WaitSplitter()
    spans: list[Any] = [("bwd", 0, 10 * MS, None, None), ("backward", 20 * MS, 30 * MS, None, None)]
    for ns in (4 * MS, 22 * MS, 50 * MS):  # the last one is outside any backward phase
        splitter.launched(ns, None)
    splitter(spans, 0)
    assert [s[:3] for s in spans] == [
        ("bwd", 0, 4 * MS),
        ("comm_wait", 4 * MS, 10 * MS),
        ("backward", 20 * MS, 22 * MS),
        ("comm_wait", 22 * MS, 30 * MS),
    ]
    assert splitter.stats.unmatched == 1
    splitter(spans, 1)  # marks do not leak into the next step
    assert splitter.stats.split == 2


def test_cuda_split_uses_the_launch_event_and_keeps_wall_spans_without_one() -> None:
    gpu = FakeGpu()
    a, mid, b = gpu.factory(), gpu.factory(), gpu.factory()
    splitter = WaitSplitter()
    splitter.launched(5 * MS, mid)
    spans: list[Any] = [("backward", 0, 9 * MS, a, b)]
    splitter(spans, 0)
    assert spans == [("backward", 0, 5 * MS, a, mid), ("comm_wait", 5 * MS, 9 * MS, mid, b)]
    splitter.launched(5 * MS, None)  # the event could not be recorded: leave the span whole
    spans = [("backward", 0, 9 * MS, a, b)]
    splitter(spans, 1)
    assert spans == [("backward", 0, 9 * MS, a, b)] and splitter.stats.errors == {"cuda_event": 1}


def test_through_the_sdk_the_record_carries_comm_wait(agent: FakeAgent) -> None:
    sw = stepwatch.init(
        "j", rank=0, world_size=1, agent_socket=agent.path, timing="wall", job_events=False
    )
    splitter = WaitSplitter()
    sw.add_step_hook(splitter)
    with sw.step() as s, s.phase("backward"):
        busy(2)
        splitter.launched(perf_counter_ns(), None)
        busy(3)
    sw.flush()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.phases is not None and rec.phases.comm_wait is not None
    assert rec.phases.backward is not None and rec.phases.backward >= 0.0015
    assert rec.phases.comm_wait >= 0.0025
    sw.close()


def test_a_failing_step_hook_never_reaches_training(agent: FakeAgent) -> None:
    sw = stepwatch.init(
        "j", rank=0, world_size=1, agent_socket=agent.path, timing="wall", job_events=False
    )

    def broken(spans: list[Any], step: int) -> None:
        raise RuntimeError("boom")

    sw.add_step_hook(broken)
    with sw.step() as s, s.phase("forward"):
        pass
    sw.flush()
    assert len(agent.steps()) == 1 and sw.stats()["misuse"] == {"step_hook": 1}
    sw.remove_step_hook(broken)
    sw.close()


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def no_torch(name: str, *args: Any, **kw: Any) -> Any:
        return None if name == "torch" else real(name, *args, **kw)

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    with pytest.raises(MissingDependencyError, match=r"pip install 'stepwatch\[torch\]'"):
        require_torch()
    assert "stepwatch[torch]" in INSTALL_HINT


def busy(ms: float) -> None:
    end = perf_counter_ns() + ms * MS
    while perf_counter_ns() < end:
        pass


# --------------------------------------------------------------------------- real DDP
@pytest.fixture()
def ddp_group() -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from stepwatch.daemons.process import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield torch
    finally:
        dist.destroy_process_group()


def test_real_ddp_model_reports_backward_and_comm_wait(ddp_group: Any, agent: FakeAgent) -> None:
    torch = ddp_group
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepwatch.integrations.torch import instrument_ddp

    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)),
        bucket_cap_mb=0.01,
    )  # several buckets
    sw = stepwatch.init("j", rank=0, world_size=1, agent_socket=agent.path, job_events=False)
    handle = instrument_ddp(model, sw, time_buckets=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        with sw.step() as s:
            with s.phase("forward"):
                loss = model(torch.randn(8, 64)).pow(2).mean()
            with s.phase("backward"):
                loss.backward()
            with s.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    sw.flush()
    recs = [d.step for d in agent.steps()]
    assert len(recs) == 3
    for rec in recs:
        assert rec.phases is not None and rec.phases.comm_wait is not None
        assert rec.phases.backward is not None
    stats = handle.stats()
    assert stats["split"] == 3 and stats["buckets"] >= 3 and stats["errors"] == {}  # type: ignore[operator]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    handle.remove()
    sw.close()


def test_instrument_ddp_refuses_a_plain_module(ddp_group: Any) -> None:
    from stepwatch.integrations.torch import instrument_ddp

    sw = stepwatch.init("j", rank=0, world_size=1, enabled=False)
    with pytest.raises(StepwatchError, match="DistributedDataParallel"):
        instrument_ddp(ddp_group.nn.Linear(2, 2), sw)


def test_timing_failures_never_reach_training(
    ddp_group: Any, agent: FakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = ddp_group
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepwatch.integrations.torch import instrument_ddp

    model = DDP(torch.nn.Linear(16, 1))
    sw = stepwatch.init("j", rank=0, world_size=1, agent_socket=agent.path, job_events=False)
    handle = instrument_ddp(model, sw)

    def broken() -> None:
        raise RuntimeError("no events today")

    monkeypatch.setattr(sw, "new_event", broken)
    with sw.step() as s, s.phase("backward"):
        model(torch.randn(4, 16)).sum().backward()
    assert model.module.weight.grad is not None
    assert handle.stats()["errors"] == {"launch_mark": 1}
    sw.close()


def test_fsdp_waits_are_carved_out_of_the_phase_that_holds_them() -> None:
    from stepwatch.integrations.torch.split import Wait

    gpu = FakeGpu()
    a, w0, w1, b = (gpu.factory() for _ in range(4))
    splitter = WaitSplitter()
    splitter.waited(Wait(2 * MS, 3 * MS, None, None))
    splitter.waited(Wait(12 * MS, 15 * MS, w0, w1))
    splitter.waited(Wait(40 * MS, 41 * MS, None, None))  # in no phase: left alone
    spans: list[Any] = [("forward", 0, 10 * MS, None, None), ("backward", 10 * MS, 20 * MS, a, b)]
    splitter(spans, 0)
    assert spans == [
        ("forward", 0, 2 * MS, None, None),
        ("comm_wait", 2 * MS, 3 * MS, None, None),
        ("forward", 3 * MS, 10 * MS, None, None),
        ("backward", 10 * MS, 12 * MS, a, w0),
        ("comm_wait", 12 * MS, 15 * MS, w0, w1),
        ("backward", 15 * MS, 20 * MS, w1, b),
    ]
    assert splitter.stats.split == 2 and splitter.stats.unmatched == 1


def test_real_fsdp2_model_reports_all_gather_waits(ddp_group: Any, agent: FakeAgent) -> None:
    torch = ddp_group
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        pytest.skip("no FSDP2 in this torch")
    from stepwatch.integrations.torch import instrument_fsdp

    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 1))
    for layer in net:
        fully_shard(layer)
    fully_shard(net)
    sw = stepwatch.init("j", rank=0, world_size=1, agent_socket=agent.path, job_events=False)
    handle = instrument_fsdp(net, sw)
    for _ in range(2):
        with sw.step() as s:
            with s.phase("forward"):
                loss = net(torch.randn(4, 32)).sum()
            with s.phase("backward"):
                loss.backward()
    sw.flush()
    recs = [d.step for d in agent.steps()]
    assert len(recs) == 2 and all(r.phases and r.phases.comm_wait is not None for r in recs)
    assert handle.stats()["split"] >= 6 and handle.stats()["errors"] == {}  # type: ignore[operator]
    sw.close()
