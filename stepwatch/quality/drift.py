"""A third generated family ("drift"): slow per-rank drift, heavy tails, ragged batches.

Written after the detector's two-tier and network changes were designed, and
not used to tune them (see docs/detection.md, "Scenario families"). What it
adds to :mod:`stepwatch.quality.wild`:

* **autocorrelated drift**: every rank's forward/backward speed follows its own
  AR(1) process (coefficient 0.95-0.99, stationary spread 1-2.5 %), so a rank
  can sit a few per cent above its peers for tens of steps with nothing wrong;
* **heavy tails**: Student-t jitter with 2.5-4 degrees of freedom per phase;
* **variable-length batches**: each rank's batch length varies per step
  (log-normal, 3-8 %), which moves its compute and nothing else;
* **optimizer episodes**: now and then one rank's optimizer step is 1.4-2.3x its
  peers' for 15-70 steps (a few ms: what real jobs on a busy host show);
* checkpoints every 50 steps, evaluation every 100 (every rank at once);
* **faults**: a slower GPU, a data-loader slowdown on one rank (onset to find),
  a congested NIC whose job slows only 1-4 % or about 10 %, and a slow host that
  is half of a two-host job (no majority to compare it with).

GPU and port samples come from :class:`stepwatch.quality.wild_telemetry.Telemetry`
(its congested port is the fault's port).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    Message,
    Phases,
    PortMessage,
    StepMessage,
    StepRecord,
)
from stepwatch.quality import wild
from stepwatch.quality.wild_telemetry import Telemetry

GPUS = wild.GPUS
CHECKPOINT_EVERY = 50
EVAL_EVERY = 100


class Kind(enum.StrEnum):
    GPU = "drift_gpu_compute"  # one rank computes slower, telemetry healthy
    DATA = "drift_rank_data"  # one rank's data loader slows
    NIC_SMALL = "drift_nic_small"  # a congested port, the job 1-4 % slower
    NIC = "drift_nic"  # a congested port, the job about 10 % slower
    HALF_HOST = "drift_half_host"  # one host of a two-host job computes slower


@dataclass(frozen=True)
class DriftJob:
    job_id: str
    seed: int
    nodes: int
    steps: int
    step_s: float
    ddp: bool
    kind: Kind | None = None
    start: int = 0
    severity: float = 0.0
    host: int = 0
    rank: int = 0
    port: int = 0
    start_ts: float = 1_790_000_000.0

    @property
    def world(self) -> int:
        return self.nodes * GPUS

    def host_name(self, i: int) -> str:
        return f"{self.job_id}-h{i:03d}"

    def telemetry_job(self) -> wild.Job:
        """The same job as :mod:`stepwatch.quality.wild_telemetry` sees it."""
        fault = None
        if self.kind in (Kind.NIC, Kind.NIC_SMALL):
            fault = wild.Fault(
                wild.Kind.NIC_CONGESTION, self.start, self.severity, host=self.host, port=self.port
            )
        return wild.Job(
            self.job_id, self.seed, self.nodes, self.steps, step_s=self.step_s, fault=fault
        )


class Model:
    """Per-step phase times (data, forward, backward, optimizer) of every rank."""

    def __init__(self, job: DriftJob) -> None:
        self.job = job
        rng = self.rng = np.random.default_rng(job.seed)
        w, t = job.world, job.step_s
        self.df = float(rng.uniform(2.5, 4.0))
        self.jitter = float(rng.uniform(0.006, 0.015))
        self.phi = float(rng.uniform(0.95, 0.99))
        self.drift_sd = float(rng.uniform(0.01, 0.025))
        self.batch_sd = float(rng.uniform(0.03, 0.08))
        self.drift = rng.normal(0, self.drift_sd, w)
        opt = float(rng.uniform(0.005, 0.02))
        data = float(rng.uniform(0.01, 0.04))
        fwd = float(rng.uniform(0.25, 0.35)) * (0.85 - opt - data)
        self.base = np.array([data, fwd, 0.85 - opt - data - fwd, opt]) * t
        self.ar = t * 0.15
        self.episode = (-1, 0, 1.0)  # (rank, steps left, optimizer factor)

    def step(self, s: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Reported phases (4 x ranks), comm_wait (NaN under DDP), wall time."""
        job, rng, w = self.job, self.rng, self.job.world
        innov = np.sqrt(1 - self.phi**2) * self.drift_sd
        self.drift = self.phi * self.drift + rng.normal(0, innov, w)
        batch = rng.lognormal(0, self.batch_sd, w)
        z = np.clip(rng.standard_t(self.df, (4, w)), -10, 10)
        x = self.base[:, None] * (1 + self.jitter * z)
        x[1:3] *= (1 + self.drift) * batch
        self._optimizer_episode(x)
        self._fault(s, x)
        x = np.maximum(x, 1e-5)
        pre = x.sum(axis=0) - x[3]
        ar = self.ar * (1 + 0.05 * abs(float(rng.standard_t(self.df))))
        if self.job.kind in (Kind.NIC, Kind.NIC_SMALL) and s >= job.start:
            ar += job.severity * job.step_s
        wait = pre.max() + ar - pre
        if job.ddp:
            x[2] += wait
            comm = np.full(w, np.nan)
        else:
            comm = wait
        wall = float(pre.max() + ar + x[3].max())
        return x, comm, wall

    def _optimizer_episode(self, x: np.ndarray) -> None:
        rank, left, factor = self.episode
        if left == 0 and self.rng.random() < 0.01:
            rank = int(self.rng.integers(0, self.job.world))
            left = int(self.rng.integers(15, 71))
            factor = float(self.rng.uniform(1.4, 2.3))
        if left > 0:
            x[3, rank] *= factor
            self.episode = (rank, left - 1, factor)

    def _fault(self, s: int, x: np.ndarray) -> None:
        job = self.job
        if job.kind is None or s < job.start:
            return
        extra = job.severity * job.step_s
        if job.kind is Kind.GPU:
            x[1, job.rank] += extra / 3
            x[2, job.rank] += 2 * extra / 3
        elif job.kind is Kind.DATA:
            x[0, job.rank] += extra
        elif job.kind is Kind.HALF_HOST:
            on = slice(job.host * GPUS, (job.host + 1) * GPUS)
            x[1, on] += extra / 3
            x[2, on] += 2 * extra / 3


def pause(s: int, step_s: float) -> float:
    """Checkpoint save (every 50 steps) or evaluation (every 100): every rank at once."""
    if s and s % EVAL_EVERY == 0:
        return 3.0 * step_s
    if s and s % CHECKPOINT_EVERY == 0:
        return 1.5 * step_s
    return 0.0


def generate(job: DriftJob) -> Iterator[Message]:
    """The job's messages in event-time order."""
    model = Model(job)
    tele = Telemetry(job.telemetry_job(), np.random.default_rng(job.seed + 1))
    t = job.start_ts
    yield EventMessage(
        host=job.host_name(0),
        ts=t,
        type=EventType.JOB_START,
        job_id=job.job_id,
        rank=0,
        attrs={"world_size": job.world},
    )
    for s in range(job.steps):
        x, comm, wall = model.step(s)
        ckpt = pause(s, job.step_s)
        end = t + wall + ckpt
        ts = end + 0.05
        for h in range(job.nodes):
            recs = [
                _record(job, r, s, t, end, x[:, r], comm[r], ckpt)
                for r in range(h * GPUS, (h + 1) * GPUS)
            ]
            yield StepMessage(host=job.host_name(h), ts=ts, job_id=job.job_id, steps=recs)
        for h in range(job.nodes):
            yield GpuMessage(host=job.host_name(h), ts=ts, job_id=job.job_id, gpus=tele.gpus(h, s))
            yield PortMessage(
                host=job.host_name(h),
                ts=ts,
                job_id=job.job_id,
                ports=tele.ports(h, s, wall + ckpt, False),
            )
        t = end + 0.002
    yield EventMessage(
        host=job.host_name(0), ts=t + 0.1, type=EventType.JOB_END, job_id=job.job_id, rank=0, code=0
    )


def _record(
    job: DriftJob, r: int, s: int, t0: float, t1: float, x: np.ndarray, comm: float, ckpt: float
) -> StepRecord:
    phases = Phases(
        data=float(x[0]),
        forward=float(x[1]),
        backward=float(x[2]),
        optimizer=float(x[3]),
        comm_wait=None if comm != comm else float(comm),
        checkpoint=ckpt if ckpt else None,
    )
    return StepRecord(
        job_id=job.job_id,
        rank=r,
        world_size=job.world,
        step=s,
        start=t0,
        end=t1,
        host=job.host_name(r // GPUS),
        local_rank=r % GPUS,
        gpu=r % GPUS,
        group="all",
        phases=phases,
        samples=32,
        tokens=32 * 4096,
    )
