"""A third family: labelled recordings of real jobs, scored like the generated ones.

A recording is a folder of JSON Lines files of contract messages (one message
per line, as the agents published them: ``stepwatch replay`` reads the same
files) and a ``labels.json`` that says, per file stem, what was done to the
job: ``{"fault": "compute" | "data" | "cpu" | "healthy", "rank": r, "ranks":
[...], "host": "...", "start_step": s, ...}``. ``tests/fixtures/torch`` holds
real PyTorch DDP/FSDP runs recorded this way: on CPU by
``tests/integration/integrations/test_torch_ddp.py`` (``STEPWATCH_TORCH_RECORD=1`` records
new ones), on a GPU by ``tests/fixtures/torch/record_gpu.py``::

    stepwatch bench detect --recorded tests/fixtures/torch

A label's severity is the *effective* slowdown, measured in the recording: the
median step time after the fault's start against before it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from stepwatch.contract import Message, StepMessage, decode
from stepwatch.errors import ConfigError, ContractError
from stepwatch.sim import Label

# fault -> (expected detection, also accepted, cause)
EXPECTED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "compute": ("straggler", (), "gpu"),
    "data": ("straggler", (), "host_input"),
    "cpu": ("straggler", ("job_slowdown",), "host_input"),
}


@dataclass(frozen=True)
class RecordedCase:
    """One recorded job (the surface of :class:`stepwatch.quality.suite.BenchCase`)."""

    name: str
    path: Path
    label: dict[str, Any]

    @property
    def healthy(self) -> bool:
        return self.label.get("fault") == "healthy"

    @property
    def severity(self) -> float | None:
        return None if self.healthy else _effect(self.steps, int(self.label["start_step"]))

    @property
    def job_hours(self) -> float:
        ts = [m.ts for m in self.messages()]
        return (max(ts) - min(ts)) / 3600.0 if ts else 0.0

    def messages(self) -> Iterator[Message]:
        with open(self.path, "rb") as lines:
            for n, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        yield decode(line.strip())
                    except ContractError as err:
                        raise ConfigError(
                            f"{self.path}:{n}: not a contract message: {err}"
                        ) from err

    def labels(self) -> list[Label]:
        if self.healthy:
            return []
        fault = str(self.label.get("fault"))
        if fault not in EXPECTED:
            raise ConfigError(
                f"{self.path.parent / 'labels.json'}: {self.name}: fault "
                f"{fault!r} is not one of {sorted(EXPECTED)} or 'healthy'"
            )
        detection, accepted, cause = EXPECTED[fault]
        steps = self.steps
        start = int(self.label["start_step"])
        ranks = tuple(int(r) for r in self.label.get("ranks") or [self.label["rank"]])
        starts = [r.start for m in steps for r in m.steps if r.step == start]
        return [
            Label(
                job_id=steps[0].job_id,
                kind=f"recorded_{fault}",
                detection=detection,
                accepted=accepted,
                cause=cause,
                fault_class="system",
                action="inspect",
                ranks=ranks,
                rank=ranks[0] if len(ranks) == 1 else None,
                host=self.label.get("host"),
                severity=_effect(steps, start),
                start_step=start,
                start_ts=min(starts) if starts else 0.0,
                summary=f"{fault} x{self.label.get('factor')} on ranks {list(ranks)} "
                f"from step {start}",
            )
        ]

    @cached_property
    def steps(self) -> list[StepMessage]:
        """The recording's step messages (read once)."""
        steps = [m for m in self.messages() if isinstance(m, StepMessage)]
        if not steps:
            raise ConfigError(f"{self.path}: no step messages")
        return steps


def _effect(steps: list[StepMessage], start: int) -> float:
    """Median step duration from ``start`` on against before it (after 5 warm-up steps)."""
    before = [r.end - r.start for m in steps for r in m.steps if 5 <= r.step < start]
    after = [r.end - r.start for m in steps for r in m.steps if r.step >= start]
    if not before or not after:
        return 0.0
    return round(max(0.0, statistics.median(after) / statistics.median(before) - 1.0), 3)


def cases(folder: str | Path) -> list[RecordedCase]:
    """The labelled recordings of ``folder`` (every ``*.jsonl`` needs a label)."""
    root = Path(folder)
    try:
        labels = json.loads((root / "labels.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{root}: cannot read labels.json: {err}") from err
    files = sorted(root.glob("*.jsonl"))
    unlabelled = [f.name for f in files if f.stem not in labels]
    if not files or unlabelled:
        raise ConfigError(f"{root}: recordings without a label: {unlabelled or 'no *.jsonl'}")
    return [RecordedCase(f.stem, f, labels[f.stem]) for f in files]
