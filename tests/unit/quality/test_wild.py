"""The independent scenario family and the scorer's incident rules."""

from __future__ import annotations

import pytest

from stepwatch.contract import DetectionMessage, StepMessage, decode, encode
from stepwatch.quality.score import CaseResult, summarise
from stepwatch.quality.wild import Fault, Job, Kind, generate
from stepwatch.quality.wild_suite import WildCase, label_of, suite

pytestmark = pytest.mark.unit


def test_messages_are_valid_contract_messages_in_time_order() -> None:
    job = Job("w", seed=1, nodes=2, steps=30, accounting="ddp")
    msgs = list(generate(job))
    assert [decode(encode(m)) for m in msgs] == msgs
    ts = [m.ts for m in msgs]
    assert ts == sorted(ts)
    steps = [r for m in msgs if isinstance(m, StepMessage) for r in m.steps]
    assert len(steps) == 30 * 16
    assert all(r.phases is not None and r.phases.comm_wait is None for r in steps)  # DDP


def test_ddp_accounting_equalises_busy_time_and_hides_the_wait_in_backward() -> None:
    job = Job(
        "w",
        seed=2,
        nodes=2,
        steps=40,
        accounting="ddp",
        fault=Fault(Kind.GPU_COMPUTE, start=10, severity=0.2, rank=3),
    )
    recs = [r for m in generate(job) if isinstance(m, StepMessage) for r in m.steps if r.step == 30]
    busy = {
        r.rank: r.phases.data + r.phases.forward + r.phases.backward  # type: ignore[union-attr]
        for r in recs
    }
    fwd = {r.rank: r.phases.forward for r in recs}  # type: ignore[union-attr]
    bwd = {r.rank: r.phases.backward for r in recs}  # type: ignore[union-attr]
    assert max(busy.values()) - min(busy.values()) < 0.02
    assert max(fwd, key=lambda k: fwd[k]) == 3
    assert min(bwd, key=lambda k: bwd[k]) == 3


def test_parameters_are_drawn_per_seed() -> None:
    a, b = suite(quick=True, seed=1), suite(quick=True, seed=2)
    assert [c.job.nodes for c in a] != [c.job.nodes for c in b] or [c.job.step_s for c in a] != [
        c.job.step_s for c in b
    ]


def _det(**kw: object) -> DetectionMessage:
    base: dict[str, object] = {
        "host": "stepwatch",
        "ts": 2e9,
        "id": "x",
        "job_id": "j",
        "type": "straggler",
        "state": "open",
    }
    base.update(kw)
    return DetectionMessage(**base)  # type: ignore[arg-type]


def test_scorer_host_level_hit_linked_detections_and_duplicates() -> None:
    job = Job(
        "j", seed=1, nodes=2, steps=120, fault=Fault(Kind.HOST_DATA, start=60, severity=0.2, host=1)
    )
    case = WildCase("c", job, "s", False, 0.2)
    label = label_of(job, job.fault)  # type: ignore[arg-type]
    host = _det(id="a", host=job.host(1), ranks=[8, 9, 10], ts=label.start_ts + 5)
    linked = _det(id="b", type="job_slowdown", related="a", ts=label.start_ts + 6)
    again = _det(id="c", rank=9, ts=label.start_ts + 7)
    res = summarise([CaseResult(case, [label], [host, linked], 1, 1, 0.0)])
    assert (res["precision"], res["recall"], res["duplicates"]) == (1.0, 1.0, 0)
    res = summarise([CaseResult(case, [label], [host, linked, again], 1, 1, 0.0)])
    assert res["duplicates"] == 1
