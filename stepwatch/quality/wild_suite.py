"""The "wild" family's cases: parameters drawn per seed, labels from the fault mechanics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import Message
from stepwatch.quality.wild import GPUS, Fault, Job, Kind, _Model, generate
from stepwatch.sim import Label

# kind -> (expected detection, accepted, cause, host-level?)
EXPECTED: dict[Kind, tuple[str, tuple[str, ...], str]] = {
    Kind.GPU_COMPUTE: ("straggler", (), "gpu"),
    Kind.GPU_THROTTLE: ("straggler", (), "gpu"),
    Kind.RANK_DATA: ("straggler", (), "host_input"),
    Kind.HOST_DATA: ("straggler", ("job_slowdown",), "host_input"),
    Kind.LEMON_HOST: ("straggler", ("job_slowdown",), "gpu"),
    Kind.NIC_CONGESTION: ("job_slowdown", (), "network"),
    Kind.PP_LINK: ("job_slowdown", (), "network"),
    Kind.HOST_CPU: ("straggler", ("job_slowdown",), "host_input"),
}
SEVERITIES = (0.12, 0.18, 0.25)  # of the step time; labels carry the effective slowdown


@dataclass(frozen=True)
class WildCase:
    """One job of the family (the same surface as :class:`stepwatch.quality.suite.Case`)."""

    name: str
    job: Job
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
        return [] if self.job.fault is None else [label_of(self.job, self.job.fault)]


def label_of(job: Job, f: Fault) -> Label:
    detection, accepted, cause = EXPECTED[f.kind]
    host_level = f.kind in (Kind.HOST_DATA, Kind.LEMON_HOST, Kind.HOST_CPU)
    network = f.kind in (Kind.NIC_CONGESTION, Kind.PP_LINK)
    if host_level:
        ranks: tuple[int, ...] = tuple(range(f.host * GPUS, (f.host + 1) * GPUS))
    elif network:
        ranks = ()
    else:
        ranks = (f.rank,)
    host = job.host(f.host if (host_level or network) else f.rank // GPUS)
    start_ts, effect = _effect(job, f.start)
    return Label(
        job_id=job.job_id,
        kind=f.kind.value,
        detection=detection,
        accepted=accepted,
        cause=cause,
        fault_class="system",
        action="inspect",
        ranks=ranks,
        rank=ranks[0] if len(ranks) == 1 else None,
        host=host,
        device=f"mlx5_{f.port}" if network else None,
        port=1 if network else None,
        severity=effect,
        start_step=f.start,
        start_ts=start_ts,
        summary=f"{f.kind.value} on {host} from step {f.start}",
    )


def _effect(job: Job, start: int) -> tuple[float, float]:
    """Event time the fault's first step starts (the same model run as the messages) and
    the job's *effective* slowdown: median step time over 40 steps after the start
    against 40 before. A fault the pipeline's slack absorbs slows nothing: it is
    labelled with the slowdown it causes, not the one injected."""
    model = _Model(job)
    t = job.start_ts
    walls = []
    t_start = t
    for s in range(min(job.steps, start + 40)):
        if s == start:
            t_start = t
        wall = model.step(s)[2]
        walls.append(wall)
        t += wall + 0.002
    before = float(np.median(walls[max(0, start - 40) : start]))
    after = float(np.median(walls[start:]))
    return round(t_start, 6), round(max(0.0, after / before - 1.0), 3)


def _shape(rng: np.random.Generator, big: bool) -> tuple[int, int]:
    nodes = int(rng.choice([4, 8, 16, 32, 64] if big else [2, 4, 8]))
    stages = int(rng.choice([1, 1, 2, 4])) if nodes >= 4 else 1
    return nodes, stages


def suite(*, quick: bool, seed: int) -> list[WildCase]:
    """Fault runs of every kind and severity, and healthy runs up to 512 ranks."""
    rng = np.random.default_rng(10_000 + seed)
    cases: list[WildCase] = []
    reps = 1 if quick else 2
    n = 0
    for kind in Kind:
        for sev in SEVERITIES:
            for _ in range(reps):
                n += 1
                nodes, stages = _shape(rng, not quick)
                if kind is Kind.PP_LINK:
                    stages = max(stages, 2)
                    nodes = max(nodes, 4)
                job = _job(rng, seed, n, nodes, stages, kind, sev, 240)
                assert job.fault is not None
                effect = _effect(job, job.fault.start)[1]
                cases.append(
                    WildCase(
                        f"{kind.value}@{int(sev * 100)}%-{job.world}r",
                        job,
                        f"{job.world}r/{stages}pp",
                        False,
                        effect,
                    )
                )
    healthy = [(2, 1, 600), (8, 2, 400), (32, 1, 300), (4, 4, 500)]
    if not quick:
        healthy += [(64, 1, 250), (32, 4, 300), (16, 1, 800), (8, 1, 1200)]
    for nodes, stages, steps in healthy:
        n += 1
        job = _job(rng, seed, n, nodes, stages, None, 0.0, steps)
        cases.append(
            WildCase(
                f"healthy-{job.world}r-{stages}pp", job, f"{job.world}r/{stages}pp", True, None
            )
        )
    return cases


def _job(
    rng: np.random.Generator,
    seed: int,
    n: int,
    nodes: int,
    stages: int,
    kind: Kind | None,
    sev: float,
    steps: int,
) -> Job:
    job_id = f"wild{seed}-{n:03d}"
    fault = None
    if kind is not None:
        start = int(rng.integers(60, 120))
        host = int(rng.integers(0, nodes))
        stage = 1
        if kind is Kind.PP_LINK:
            stage = int(rng.integers(1, stages))
            senders = [h for h in range(nodes) if h * stages // nodes == stage - 1]
            host = int(rng.choice(senders))
        rank = host * GPUS + int(rng.integers(0, GPUS))
        fault = Fault(
            kind, start, sev, host=host, rank=rank, port=int(rng.integers(0, 8)), stage=stage
        )
    return Job(
        job_id=job_id,
        seed=seed * 7919 + n,
        nodes=nodes,
        steps=steps,
        stages=stages,
        accounting=str(rng.choice(["ddp", "explicit"])),
        step_s=float(rng.uniform(0.5, 4.0)),
        fault=fault,
    )
