"""The scenario suite of the detection-quality benchmark (seeded, deterministic)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stepwatch.contract import Message
from stepwatch.sim import Fault, FaultKind, Label, Scenario, ground_truth, simulate

SLOWDOWNS = (
    FaultKind.SLOW_GPU,
    FaultKind.THERMAL_THROTTLE,
    FaultKind.POWER_THROTTLE,
    FaultKind.NIC_CONGESTION,
    FaultKind.DATALOADER_STALL,
    FaultKind.SLOW_RANK,
)
STOPS = (
    FaultKind.XID79,
    FaultKind.XID48,
    FaultKind.RANK_CRASH,
    FaultKind.JOB_HANG,
    FaultKind.NAN_LOSS,
    FaultKind.LINK_FLAP,
)
SEVERITIES = (0.05, 0.10, 0.30)
# heavy noise: 2.5 % per-step compute jitter, frequent tails and GC pauses, pauses every 50 steps
HEAVY: dict[str, Any] = {
    "jitter": 0.025,
    "tail_prob": 0.02,
    "gc_prob": 0.01,
    "eval_every": 50,
    "checkpoint_every": 100,
}


@dataclass(frozen=True)
class Shape:
    name: str
    nodes: int
    stages: int
    steps: int  # steps of a fault run


DP8 = Shape("dp8", 1, 1, 260)
DP32 = Shape("dp32", 4, 1, 260)
PP64 = Shape("pp4x64", 8, 4, 260)
DP256 = Shape("dp256", 32, 1, 200)
PP1024 = Shape("pp8x1024", 128, 8, 170)


@dataclass(frozen=True)
class Case:
    name: str
    scenarios: tuple[Scenario, ...]  # several: concurrent jobs through one engine
    shape: str
    healthy: bool
    severity: float | None  # of the slowdown fault; None: healthy or a stopping fault
    heavy_noise: bool

    @property
    def job_hours(self) -> float:
        return sum(sc.steps * sc.step_seconds for sc in self.scenarios) / 3600.0

    def messages(self) -> Iterator[Message]:
        return iter(simulate(*self.scenarios))

    def labels(self) -> list[Label]:
        return ground_truth(*self.scenarios)


class BenchCase(Protocol):
    """What the harness needs of a case, whichever family built it."""

    @property
    def name(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def severity(self) -> float | None: ...
    @property
    def job_hours(self) -> float: ...
    def messages(self) -> Iterator[Message]: ...
    def labels(self) -> list[Label]: ...


def suite(*, quick: bool, seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    shapes = (DP8, DP32, PP64) if quick else (DP8, DP32, PP64, DP256, PP1024)
    cases: list[Case] = []
    n = 0

    def add(
        shape: Shape,
        faults: tuple[Fault, ...],
        heavy: bool,
        sev: float | None,
        label: str,
        **knobs: Any,
    ) -> None:
        nonlocal n
        n += 1
        extra = dict(HEAVY) if heavy else {}
        extra.update(knobs)
        steps = int(extra.pop("steps", shape.steps))
        sc = Scenario(
            seed=seed * 1000 + n,
            job_id=f"{label}-{n}",
            nodes=shape.nodes,
            pipeline_stages=shape.stages,
            steps=steps,
            faults=faults,
            **extra,
        )
        cases.append(Case(label, (sc,), shape.name, not faults, sev, heavy))

    for i, kind in enumerate(SLOWDOWNS):
        for j, sev in enumerate(SEVERITIES):
            picks = [shapes[(i + j) % len(shapes)]] if quick else list(shapes)
            for k, shape in enumerate(picks):
                if shape is PP1024 and sev != 0.10:
                    continue  # the largest shape: one severity keeps the full run short
                start = int(rng.integers(90, 131))
                heavy = bool((i + j + k) % 2)
                add(
                    shape,
                    (Fault(kind, start_step=start, severity=sev),),
                    heavy,
                    sev,
                    f"{kind.value}@{int(sev * 100)}%-{shape.name}",
                )
    if not quick:  # lemon hosts: every GPU of one host slower
        for shape in (DP32, DP256):
            for sev in (0.10, 0.30):
                host = f"node{int(rng.integers(shape.nodes)):04d}"
                add(
                    shape,
                    (Fault(FaultKind.SLOW_GPU, host=host, start_step=110, severity=sev),),
                    False,
                    sev,
                    f"lemon_host@{int(sev * 100)}%-{shape.name}",
                )
    for i, kind in enumerate(STOPS):
        picks = [shapes[i % len(shapes)]] if quick else list(shapes[:4])
        for shape in picks:
            start = int(rng.integers(90, 131))
            add(
                shape,
                (Fault(kind, start_step=start),),
                bool(i % 2),
                None,
                f"{kind.value}-{shape.name}",
            )
    healthy = [(DP8, 600, 2.0), (DP32, 600, 1.0), (PP64, 400, 4.0), (DP32, 300, 10.0)]
    if not quick:
        healthy += [
            (DP8, 1200, 10.0),
            (PP64, 800, 1.0),
            (DP256, 400, 3.0),
            (PP1024, 200, 5.0),
            (DP32, 1000, 6.0),
            (PP64, 600, 10.0),
            (DP32, 2000, 6.0),
            (DP8, 3000, 12.0),
        ]
    cases.append(_fleet(seed))
    for shape, steps, step_s in healthy:
        add(
            shape,
            (),
            True,
            None,
            f"healthy-{shape.name}-{step_s:g}s",
            steps=steps,
            step_seconds=step_s,
        )
    return cases


def _fleet(seed: int) -> Case:
    """Three jobs at once on disjoint hosts, one engine: faults stay in their own job."""
    common: dict[str, Any] = {"steps": 260, "start_ts": 1767225600.0}
    jobs = (
        Scenario(
            seed=seed * 1000 + 901,
            job_id="fleet-a",
            nodes=4,
            hosts=tuple(f"a{i:03d}" for i in range(4)),
            faults=(Fault(FaultKind.THERMAL_THROTTLE, start_step=120, severity=0.10),),
            **common,
        ),
        Scenario(
            seed=seed * 1000 + 902,
            job_id="fleet-b",
            nodes=8,
            pipeline_stages=4,
            hosts=tuple(f"b{i:03d}" for i in range(8)),
            **common,
            **HEAVY,
        ),
        Scenario(
            seed=seed * 1000 + 903,
            job_id="fleet-c",
            nodes=1,
            hosts=("c000",),
            faults=(Fault(FaultKind.XID79, start_step=150),),
            **common,
        ),
    )
    return Case("fleet-3-jobs", jobs, "fleet", False, 0.10, False)
