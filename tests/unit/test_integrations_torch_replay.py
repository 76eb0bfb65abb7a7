"""Recorded real DDP runs, replayed through the detection core without torch.

``tests/fixtures/torch/*.jsonl`` are the step messages two real agents
published for real 4-rank gloo DDP jobs (``examples/ddp_train.py`` with the DDP
integration, reported as host-0 = ranks 0, 1 and host-1 = ranks 2, 3); the
labels file says what was done to which rank from which step. Re-record with
``STEPWATCH_TORCH_RECORD=1 pytest tests/integration/test_torch_ddp.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepwatch.contract import DetectionMessage
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.replay import replay

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "torch"
LABELS: dict[str, dict[str, Any]] = json.loads((FIXTURES / "labels.json").read_text())


def detections(name: str) -> list[DetectionMessage]:
    found: list[DetectionMessage] = []
    errors: list[object] = []
    with open(FIXTURES / f"{name}.jsonl", "rb") as lines:
        summary = replay(lines, Engine(DetectConfig()), found.append,
                         lambda n, err, raw: errors.append((n, err)))
    assert errors == [] and summary.messages > 0
    return found


def opened(found: list[DetectionMessage]) -> list[DetectionMessage]:
    return [d for d in found if d.state == "open"]


def test_fixtures_are_small_and_labelled() -> None:
    files = sorted(FIXTURES.glob("*.jsonl"))
    assert {f.stem for f in files} == set(LABELS)
    assert sum(f.stat().st_size for f in files) < 2_000_000


@pytest.mark.parametrize("name", sorted(n for n, lab in LABELS.items() if lab["fault"] == "healthy"))
def test_healthy_run_is_silent(name: str) -> None:
    assert opened(detections(name)) == []


# compute_plain: the README loop without the integration (the wait stays inside
# backward); fsdp_compute: FSDP2 with instrument_fsdp
@pytest.mark.parametrize("name,cause", [("compute", "gpu"), ("data", "host_input"),
                                        ("compute_plain", "gpu"), ("fsdp_compute", "gpu")])
def test_one_slow_rank_is_found_with_its_cause(name: str, cause: str) -> None:
    label = LABELS[name]
    found = opened(detections(name))
    assert [(d.type, d.rank) for d in found] == [("straggler", label["rank"])], found
    (d,) = found
    assert d.cause == cause, d
    assert d.host == label["host"]
    assert label["start_step"] <= (d.first_step or 0) <= label["start_step"] + 10


def test_cpu_contention_on_a_host_is_one_incident() -> None:
    label = LABELS["cpu"]
    found = opened(detections("cpu"))
    assert len(found) == 1, found
    (d,) = found
    assert d.host == label["host"], d
    assert d.rank is None or d.rank in label["ranks"], d
    assert label["start_step"] <= (d.first_step or 0) <= label["start_step"] + 10
