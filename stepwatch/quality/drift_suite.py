"""The "drift" family's cases (see :mod:`stepwatch.quality.drift`) and their labels."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import Message
from stepwatch.quality.drift import GPUS, DriftJob, Kind, Model, generate, pause
from stepwatch.sim import Label

# kind -> (expected detection, accepted, cause)
EXPECTED: dict[Kind, tuple[str, tuple[str, ...], str]] = {
    Kind.GPU: ("straggler", (), "gpu"),
    Kind.DATA: ("straggler", (), "host_input"),
    Kind.NIC_SMALL: ("network_congestion", ("job_slowdown",), "network"),
    Kind.NIC: ("network_congestion", ("job_slowdown",), "network"),
    Kind.HALF_HOST: ("straggler", ("job_slowdown",), "gpu"),
}
SEVERITIES: dict[Kind, tuple[float, ...]] = {
    Kind.GPU: (0.12, 0.25),
    Kind.DATA: (0.12, 0.25),
    Kind.NIC_SMALL: (0.015, 0.03),
    Kind.NIC: (0.12,),
    Kind.HALF_HOST: (0.12, 0.25),
}


@dataclass(frozen=True)
class DriftCase:
    """One job of the family (the same surface as :class:`stepwatch.quality.suite.Case`)."""

    name: str
    job: DriftJob
    shape: str
    healthy: bool
    severity: float | None
    heavy_noise: bool = True

    @property
    def job_hours(self) -> float:
        return self.job.steps * self.job.step_s / 3600.0

    def messages(self) -> Iterator[Message]:
        return generate(self.job)

    def labels(self) -> list[Label]:
        return [] if self.job.kind is None else [label_of(self.job)]


def label_of(job: DriftJob) -> Label:
    assert job.kind is not None
    detection, accepted, cause = EXPECTED[job.kind]
    network = job.kind in (Kind.NIC, Kind.NIC_SMALL)
    if job.kind is Kind.HALF_HOST:
        ranks: tuple[int, ...] = tuple(range(job.host * GPUS, (job.host + 1) * GPUS))
    elif network:
        ranks = ()
    else:
        ranks = (job.rank,)
    host = job.host_name(job.host if (network or job.kind is Kind.HALF_HOST) else job.rank // GPUS)
    start_ts, effect = effect_of(job)
    return Label(
        job_id=job.job_id,
        kind=job.kind.value,
        detection=detection,
        accepted=accepted,
        cause=cause,
        fault_class="system",
        action="inspect",
        ranks=ranks,
        rank=ranks[0] if len(ranks) == 1 else None,
        host=host,
        device=f"mlx5_{job.port}" if network else None,
        port=1 if network else None,
        severity=effect,
        start_step=job.start,
        start_ts=start_ts,
        summary=f"{job.kind.value} on {host} from step {job.start}",
    )


def effect_of(job: DriftJob) -> tuple[float, float]:
    """Event time of the fault's first step and the job's effective slowdown (median step
    time without pauses, 40 steps after against 40 before)."""
    model = Model(job)
    t = t_start = job.start_ts
    walls = []
    for s in range(min(job.steps, job.start + 40)):
        if s == job.start:
            t_start = t
        wall = model.step(s)[2]
        walls.append(wall)
        t += wall + pause(s, job.step_s) + 0.002
    before = float(np.median(walls[max(0, job.start - 40) : job.start]))
    after = float(np.median(walls[job.start :]))
    return round(t_start, 6), round(max(0.0, after / before - 1.0), 3)


def suite(*, quick: bool, seed: int) -> list[DriftCase]:
    """Fault runs of every kind, healthy runs of 16 to 64 ranks (two-host jobs included)."""
    rng = np.random.default_rng(20_000 + seed)
    cases: list[DriftCase] = []
    n = 0
    reps = 2 if quick else 4
    for kind in Kind:
        for sev in SEVERITIES[kind]:
            for _ in range(reps):
                n += 1
                nodes = 2 if kind is Kind.HALF_HOST else int(rng.choice([2, 4, 8]))
                job = _job(rng, seed, n, nodes, 240, kind, sev)
                cases.append(
                    DriftCase(
                        f"{kind.value}@{sev:.3f}-{job.world}r",
                        job,
                        f"{job.world}r",
                        False,
                        effect_of(job)[1],
                    )
                )
    healthy = [(2, 800), (2, 600), (4, 600), (8, 400)]
    if not quick:
        healthy += [(2, 1200), (4, 1000), (8, 800), (2, 1500)]
    for nodes, steps in healthy:
        n += 1
        job = _job(rng, seed, n, nodes, steps, None, 0.0)
        cases.append(DriftCase(f"healthy-{job.world}r", job, f"{job.world}r", True, None))
    return cases


def _job(
    rng: np.random.Generator,
    seed: int,
    n: int,
    nodes: int,
    steps: int,
    kind: Kind | None,
    sev: float,
) -> DriftJob:
    host = int(rng.integers(0, nodes))
    return DriftJob(
        job_id=f"drift{seed}-{n:03d}",
        seed=seed * 104729 + n,
        nodes=nodes,
        steps=steps,
        step_s=float(rng.uniform(0.3, 1.5)),
        ddp=bool(rng.random() < 0.5),
        kind=kind,
        start=int(rng.integers(70, 130)),
        severity=sev,
        host=host,
        rank=host * GPUS + int(rng.integers(0, GPUS)),
        port=int(rng.integers(0, 8)),
    )
