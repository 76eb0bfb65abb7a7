"""A second scenario family ("wild"), written independently of :mod:`stepwatch.sim`.

Different noise model and fault mechanics from the simulator, so that the
detector is measured on data it was not tuned on:

* **noise**: per-rank Student-t jitter (3 to 6 degrees of freedom), rare Pareto
  spikes on single ranks, per-host biases of up to +-1 %, irregular global
  pauses (GC, evaluation, checkpoint: one to a few steps, every rank at once)
  and bursty background congestion (the collective slower for a few steps,
  counters up on random hosts);
* **accounting**: ``ddp`` jobs report no ``comm_wait``: the wait for the
  slowest rank sits inside every other rank's backward (PyTorch DDP); ``explicit``
  jobs report it; pipeline jobs have stages of unequal compute and hide the
  point-to-point waits in ``forward`` (Megatron's ``forward-backward`` style);
* **CPU**: each training thread is on a CPU for a share of its own work (kernel
  launches, Python: 15-50 %) and waits on a run queue for a small share of its
  runnable time (0.5-3 % per host, log-normal per step): ``cpu_time`` and
  ``cpu_wait`` as the SDK reports them;
* **faults**: a slower GPU (with or without throttle telemetry), a data stall on
  one rank or on every rank of a host, a lemon host, a congested NIC (every
  rank's collective slower, that host's port counters up), a congested
  pipeline link (the stage behind it waits), CPU contention on one host (its
  threads wait for a CPU: its ranks' forward and backward take longer by about
  the time they waited).

:func:`generate` turns a :class:`Job` into contract messages (steps, GPU and
port samples, job start/end events) and its :class:`stepwatch.sim.Label` list.
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
    GpuReading,
    Message,
    Phases,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
)
from stepwatch.quality.wild_telemetry import Telemetry

GPUS = 8


class Kind(enum.StrEnum):
    GPU_COMPUTE = "wild_gpu_compute"  # one GPU computes slower, telemetry healthy
    GPU_THROTTLE = "wild_gpu_throttle"  # one GPU slower, thermal throttle visible
    RANK_DATA = "wild_rank_data_stall"  # one rank's input pipeline stalls
    HOST_DATA = "wild_host_data_stall"  # every rank of one host waits for data
    LEMON_HOST = "wild_lemon_host"  # every GPU of one host computes slower
    NIC_CONGESTION = "wild_nic_congestion"  # one host's NIC congested: every collective slower
    PP_LINK = "wild_pp_link"  # a congested link between two pipeline stages
    HOST_CPU = "wild_host_cpu_contention"  # other processes compete for one host's CPUs


@dataclass(frozen=True)
class Fault:
    kind: Kind
    start: int
    severity: float  # extra time as a share of the step time
    host: int = 0  # host index
    rank: int = 0  # rank index (rank-level kinds)
    port: int = 0  # NIC index on the host (network kinds)
    stage: int = 1  # the stage that waits (pp link)


@dataclass(frozen=True)
class Job:
    job_id: str
    seed: int
    nodes: int
    steps: int
    stages: int = 1
    accounting: str = "ddp"  # ddp | explicit
    step_s: float = 1.0
    fault: Fault | None = None
    start_ts: float = 1_780_000_000.0

    @property
    def world(self) -> int:
        return self.nodes * GPUS

    def host(self, i: int) -> str:
        return f"{self.job_id}-h{i:03d}"

    def stage_of(self, rank: int) -> int:
        return (rank // GPUS) * self.stages // self.nodes  # whole hosts per stage


class _Model:
    """Per-step phase times of every rank (seconds) under the job's noise and fault."""

    def __init__(self, job: Job) -> None:
        self.job = job
        rng = self.rng = np.random.default_rng(job.seed)
        self.df = float(rng.integers(3, 7))
        self.jitter = float(rng.uniform(0.006, 0.015))
        self.spike_p = float(rng.uniform(0.0005, 0.002))
        self.pause_p = float(rng.uniform(0.004, 0.015))
        self.burst_p = float(rng.uniform(0.005, 0.02))
        w, t = job.world, job.step_s
        host_bias = 1 + rng.uniform(-0.01, 0.01, job.nodes)
        bias = np.repeat(host_bias, GPUS) * (1 + rng.uniform(-0.003, 0.003, w))
        stage_f = rng.uniform(0.8, 1.25, job.stages)
        sf = stage_f[[job.stage_of(r) for r in range(w)]]
        shares = rng.dirichlet([3, 20, 40, 4]) * float(rng.uniform(0.75, 0.9))
        self.base = np.outer(shares, bias * sf) * t  # (data, fwd, bwd, opt) x ranks
        self.ar = t * float(rng.uniform(0.08, 0.2))  # exposed all-reduce tail
        self.stage = np.array([job.stage_of(r) for r in range(w)])
        self.burst_left = 0
        # CPU readings from their own generator: the phase numbers do not depend on them
        self.cpu_rng = np.random.default_rng(job.seed + 2)
        self.on_cpu = float(self.cpu_rng.uniform(0.15, 0.5))
        share = np.repeat(self.cpu_rng.uniform(0.005, 0.03, job.nodes), GPUS)
        self.wait_ratio = share / (1 - share)
        self.cpu_extra = np.zeros(w)  # run-queue wait a fault adds this step

    def _noise(self) -> np.ndarray:
        rng, w = self.rng, self.job.world
        z = np.clip(rng.standard_t(self.df, (4, w)), -8, 8)
        x = self.base * (1 + self.jitter * z)
        spikes = rng.random(w) < self.spike_p
        if spikes.any():
            extra = (rng.pareto(1.5, spikes.sum()) + 1) * 0.05 * self.job.step_s
            x[int(rng.integers(0, 4)), spikes] += np.minimum(extra, 3 * self.job.step_s)
        return np.maximum(x, 1e-4)

    def step(self, s: int) -> tuple[np.ndarray, np.ndarray, float, bool, np.ndarray]:
        """(data, fwd, bwd, opt) reported, comm_wait, wall time, congestion burst on,
        (cpu_time, cpu_wait) of every rank."""
        job, rng, f = self.job, self.rng, self.job.fault
        x = self._noise()
        ar = self.ar * (1 + 0.05 * abs(float(rng.standard_t(self.df))))
        if self.burst_left == 0 and rng.random() < self.burst_p:
            self.burst_left = int(rng.integers(1, 4))
        burst = self.burst_left > 0
        if burst:
            self.burst_left -= 1
            ar *= float(rng.uniform(1.2, 1.6))
        if rng.random() < self.pause_p:  # GC / eval: every rank at once, any phase
            x[int(rng.integers(0, 4))] += job.step_s * float(rng.exponential(0.8))
        p2p = np.zeros(job.world)
        self.cpu_extra[:] = 0.0
        if f is not None and s >= f.start:
            ar = self._fault(f, x, ar, p2p)
        pre = x[0] + x[1] + x[2]
        cpu = self._cpu(pre + x[3])
        stage_pre = np.array([pre[self.stage == g].max() for g in range(job.stages)])
        bubble = stage_pre.max() - stage_pre[self.stage] + p2p  # pipeline waits in forward
        x[1] += bubble
        pre = pre + bubble
        sync = pre.max() + ar
        wait = sync - pre
        if job.accounting == "ddp":
            x[2] += wait  # DDP: the wait for the slowest rank is inside backward
            comm = np.full(job.world, np.nan)
        else:
            comm = wait
        wall = float(sync + np.max(x[3]))
        return x, comm, wall, burst, cpu

    def _cpu(self, work: np.ndarray) -> np.ndarray:
        """(cpu_time, cpu_wait) of every rank's training thread for ``work`` seconds of
        its own work (a contended thread's work includes the time it waited)."""
        rng, w = self.cpu_rng, self.job.world
        own = np.maximum(work - self.cpu_extra, 1e-4)
        ran = self.on_cpu * own * (1 + 0.05 * rng.standard_normal(w))
        waited = ran * self.wait_ratio * rng.lognormal(0.0, 0.3, w) + self.cpu_extra
        return np.vstack([np.maximum(ran, 0.0), waited])

    def _fault(self, f: Fault, x: np.ndarray, ar: float, p2p: np.ndarray) -> float:
        extra = f.severity * self.job.step_s
        host = slice(f.host * GPUS, (f.host + 1) * GPUS)
        if f.kind in (Kind.GPU_COMPUTE, Kind.GPU_THROTTLE):
            x[1, f.rank] += extra / 3
            x[2, f.rank] += 2 * extra / 3
        elif f.kind is Kind.RANK_DATA:
            x[0, f.rank] += extra
        elif f.kind is Kind.HOST_DATA:
            x[0, host] += extra
        elif f.kind is Kind.LEMON_HOST:
            x[1, host] += extra / 3
            x[2, host] += 2 * extra / 3
        elif f.kind is Kind.NIC_CONGESTION:
            ar += extra
        elif f.kind is Kind.PP_LINK:
            p2p[self.stage == f.stage] += extra
        elif f.kind is Kind.HOST_CPU:  # launches wait for a CPU: the GPU idles meanwhile
            x[1, host] += extra / 3
            x[2, host] += 2 * extra / 3
            self.cpu_extra[host] = extra * self.cpu_rng.uniform(0.7, 1.0, GPUS)
        return ar


def generate(job: Job) -> Iterator[Message]:
    """The job's messages in event-time order."""
    model = _Model(job)
    tele = Telemetry(job, np.random.default_rng(job.seed + 1))
    t = job.start_ts
    yield EventMessage(
        host=job.host(0),
        ts=t,
        type=EventType.JOB_START,
        job_id=job.job_id,
        rank=0,
        attrs={"world_size": job.world},
    )
    for s in range(job.steps):
        x, comm, wall, burst, cpu = model.step(s)
        end = t + wall
        ts = end + 0.05
        for h in range(job.nodes):
            recs = [
                _record(job, r, s, t, end, x[:, r], comm[r], cpu[:, r])
                for r in range(h * GPUS, (h + 1) * GPUS)
            ]
            yield StepMessage(host=job.host(h), ts=ts, job_id=job.job_id, steps=recs)
        for h in range(job.nodes):
            gpus: list[GpuReading] = tele.gpus(h, s)
            ports: list[PortReading] = tele.ports(h, s, wall, burst)
            yield GpuMessage(host=job.host(h), ts=ts, job_id=job.job_id, gpus=gpus)
            yield PortMessage(host=job.host(h), ts=ts, job_id=job.job_id, ports=ports)
        t = end + 0.002
    yield EventMessage(
        host=job.host(0), ts=t + 0.1, type=EventType.JOB_END, job_id=job.job_id, rank=0, code=0
    )


def _record(
    job: Job, r: int, s: int, t0: float, t1: float, x: np.ndarray, comm: float, cpu: np.ndarray
) -> StepRecord:
    phases = Phases(
        data=float(x[0]),
        forward=float(x[1]),
        backward=float(x[2]),
        optimizer=float(x[3]),
        comm_wait=None if comm != comm else float(comm),
    )
    group = f"stage{job.stage_of(r)}" if job.stages > 1 else "all"
    return StepRecord(
        job_id=job.job_id,
        rank=r,
        world_size=job.world,
        step=s,
        start=t0,
        end=t1,
        host=job.host(r // GPUS),
        local_rank=r % GPUS,
        gpu=r % GPUS,
        group=group,
        phases=phases,
        samples=32,
        tokens=32 * 4096,
        cpu_time=float(cpu[0]),
        cpu_wait=float(cpu[1]),
    )
