"""What to simulate: a job's shape, its noise, and the faults injected into it.

:class:`Scenario` and :class:`Fault` are frozen dataclasses; build them once and
hand them to :func:`stepwatch.sim.simulate` and :func:`stepwatch.sim.ground_truth`.
Every field has a realistic default (see docs/simulator.md for the model).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from stepwatch.contract.records import MIN_EPOCH
from stepwatch.errors import ConfigError

DEFAULT_START_TS = 1767225600.0  # 2026-01-01T00:00:00Z: fixed, so runs are reproducible


class FaultKind(enum.StrEnum):
    """The faults the simulator can inject (the ground truth says what each should raise)."""

    SLOW_GPU = "slow_gpu"  # compute x (1 + severity), SM clock below max, no throttle bit
    THERMAL_THROTTLE = "thermal_throttle"  # hot GPU, HwThermal|SwThermal, low clock
    POWER_THROTTLE = "power_throttle"  # SwPowerCap, power pinned at a lowered limit
    NIC_CONGESTION = "nic_congestion"  # ECN/CNP/xmit_wait on a NIC, its ranks transfer slowly
    LINK_FLAP = "link_flap"  # link ACTIVE->DOWN->ACTIVE, one step stalls
    XID79 = "xid79"  # GPU fell off the bus: its rank dies, the job hangs
    XID48 = "xid48"  # double-bit ECC: its rank dies, the job hangs
    DATALOADER_STALL = "dataloader_stall"  # large data phase, GPU and NIC healthy
    JOB_HANG = "job_hang"  # every rank stops, GPUs go idle
    RANK_CRASH = "rank_crash"  # one rank dies, its peers block in the next collective
    SLOW_RANK = "slow_rank"  # compute x (1 + severity) with every GPU/NIC signal healthy
    NAN_LOSS = "nan_loss"  # user error: loss goes NaN, the job raises and ends

    @classmethod
    def parse(cls, text: str) -> FaultKind:
        try:
            return cls(text.strip().lower().replace("-", "_"))
        except ValueError as err:
            names = ", ".join(k.value for k in cls)
            raise ConfigError(f"unknown fault kind {text!r}; one of: {names}") from err


#: Faults that stop the job's progress (nothing after them happens).
STOPPING = frozenset(
    {FaultKind.XID79, FaultKind.XID48, FaultKind.JOB_HANG, FaultKind.RANK_CRASH, FaultKind.NAN_LOSS}
)
#: Faults that touch one NIC (or every NIC of a host) rather than a GPU.
NIC_FAULTS = frozenset({FaultKind.NIC_CONGESTION, FaultKind.LINK_FLAP})
#: Faults of the whole job: no rank, host or GPU target.
JOB_FAULTS = frozenset({FaultKind.JOB_HANG, FaultKind.NAN_LOSS})
#: Faults that kill exactly one rank.
SINGLE_RANK = frozenset({FaultKind.XID79, FaultKind.XID48, FaultKind.RANK_CRASH})


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Target: ``rank``; or ``host`` + ``gpu``; or ``host`` alone (every GPU of that
    host for slow-compute faults, every NIC for NIC congestion, the whole host
    for a data-loader stall); or nothing (a rank, host or NIC chosen from the
    scenario's seed). ``nic`` picks the NIC for NIC faults (default: the NIC of
    the target GPU, rail-aligned). Steps ``start_step <= s < end_step`` are
    affected (``end_step=None``: to the end). ``severity`` is the relative
    slowdown (0.10 = 10 % more time); ``duration_seconds`` is how long a link
    stays down (LINK_FLAP only, default 3 s).
    """

    kind: FaultKind
    rank: int | None = None
    host: str | None = None
    gpu: int | None = None
    start_step: int = 100
    end_step: int | None = None
    severity: float = 0.10
    nic: int | None = None
    duration_seconds: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            object.__setattr__(self, "kind", FaultKind.parse(str(self.kind)))
        if self.start_step < 0:
            raise ConfigError(f"fault {self.kind}: start_step must be >= 0")
        if self.end_step is not None and self.end_step <= self.start_step:
            raise ConfigError(f"fault {self.kind}: end_step must be > start_step")
        if not 0 <= self.severity <= 10:
            raise ConfigError(f"fault {self.kind}: severity must be in [0, 10]")
        if self.duration_seconds is not None and self.duration_seconds <= 0:
            raise ConfigError(f"fault {self.kind}: duration_seconds must be > 0")

    def active(self, step: int) -> bool:
        return step >= self.start_step and (self.end_step is None or step < self.end_step)


@dataclass(frozen=True)
class Scenario:
    """One training job on a fleet: shape, cadence, noise and faults.

    Ranks are placed node-major: rank ``r`` runs on host ``r // gpus_per_node``
    with ``local_rank = gpu = r % gpus_per_node``; GPU ``g`` uses NIC
    ``g * nics_per_node // gpus_per_node`` (rail-aligned). ``step_seconds`` is the
    nominal steady-state step time; pauses, warm-up and faults come on top.
    ``tokens_per_step`` and ``samples_per_step`` are per rank; only the first
    pipeline stage reports them (it loads the inputs), so their sum over ranks is
    the global batch. ``flops_per_token`` (optional) gives per-rank FLOPs, split
    evenly across pipeline stages.
    """

    seed: int = 1
    job_id: str = "job-1"
    nodes: int = 4
    gpus_per_node: int = 8
    nics_per_node: int = 8
    steps: int = 300
    step_seconds: float = 1.0
    pipeline_stages: int = 1
    hosts: tuple[str, ...] | None = None
    start_ts: float = DEFAULT_START_TS
    faults: tuple[Fault, ...] = ()
    warmup_steps: int = 10
    eval_every: int = 100  # 0: never
    eval_seconds: float | None = None  # default 3 x step_seconds
    checkpoint_every: int = 150  # 0: never
    checkpoint_seconds: float | None = None  # default 6 x step_seconds
    jitter: float = 0.01  # lognormal sigma of per-rank compute noise
    tail_prob: float = 0.002  # per rank-step chance of a Pareto-tailed slow step
    gc_prob: float = 0.002  # per rank-step chance of a GC pause (single slow step)
    gc_seconds: float | None = None  # default 0.15 x step_seconds
    samples_per_step: int = 8
    tokens_per_step: int = 32768
    flops_per_token: float | None = None
    with_gpu: bool = True
    with_ports: bool = True
    tick_seconds: float = 1.0  # agent tick: one message per host and kind per tick
    init_seconds: float | None = None  # job start to first step; default 5 x step, >= 5 s
    hang_tail_seconds: float | None = None  # samples after a hang; default max(180, 20 steps)
    end_tail_seconds: float = 5.0  # samples after the job ends
    bytes_per_step: float = 4e9  # bytes each NIC moves per step (both directions each)
    realtime: bool = False  # start_ts = now when simulated (see resolved())
    first_step: int = 0  # a restart from a checkpoint resumes here (warm-up again)
    incarnation: int = 0  # 0: the first run; n: the n-th restart (a restart event says so)

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        if self.hosts is not None:
            object.__setattr__(self, "hosts", tuple(self.hosts))
        self._validate()

    def _validate(self) -> None:
        positive = ("nodes", "gpus_per_node", "nics_per_node", "steps", "pipeline_stages")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"scenario {self.job_id}: {name} must be >= 1")
        if self.step_seconds <= 0 or self.tick_seconds <= 0:
            raise ConfigError(f"scenario {self.job_id}: step_seconds, tick_seconds must be > 0")
        if self.world_size % self.pipeline_stages:
            raise ConfigError(
                f"scenario {self.job_id}: world size {self.world_size} is not divisible "
                f"by pipeline_stages={self.pipeline_stages}"
            )
        if self.hosts is not None and len(self.hosts) != self.nodes:
            raise ConfigError(
                f"scenario {self.job_id}: {len(self.hosts)} hosts for {self.nodes} nodes"
            )
        if not 0 <= self.first_step < self.steps:
            raise ConfigError(f"scenario {self.job_id}: first_step must be in [0, steps)")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"scenario {self.job_id}: jitter must be in [0, 1)")
        if self.start_ts < MIN_EPOCH:  # what the contract refuses: every message dead-lettered
            raise ConfigError(
                f"scenario {self.job_id}: start_ts {self.start_ts} is before 2001-09-09 "
                f"({MIN_EPOCH:.0f} s), which the contract refuses"
            )
        for fault in self.faults:
            if fault.rank is not None and not 0 <= fault.rank < self.world_size:
                raise ConfigError(f"fault {fault.kind}: rank {fault.rank} outside the job")
            if fault.host is not None and fault.host not in self.host_names:
                raise ConfigError(f"fault {fault.kind}: host {fault.host!r} not in the job")
            if fault.gpu is not None and not 0 <= fault.gpu < self.gpus_per_node:
                raise ConfigError(
                    f"fault {fault.kind}: gpu {fault.gpu} outside 0..{self.gpus_per_node - 1}"
                )
            if fault.nic is not None and not 0 <= fault.nic < self.nics_per_node:
                raise ConfigError(
                    f"fault {fault.kind}: nic {fault.nic} outside 0..{self.nics_per_node - 1}"
                )
        from stepwatch.sim.targets import resolve_targets

        resolve_targets(self)  # a rank that is not on the given host, ...

    # ---------------------------------------------------------------- topology
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @functools.cached_property
    def host_names(self) -> tuple[str, ...]:
        if self.hosts is not None:
            return self.hosts
        return tuple(f"node{i:04d}" for i in range(self.nodes))

    def host_of(self, rank: int) -> str:
        return self.host_names[rank // self.gpus_per_node]

    def stage_of(self, rank: int) -> int:
        return rank // (self.world_size // self.pipeline_stages)

    def group_of(self, rank: int) -> str:
        return "all" if self.pipeline_stages == 1 else f"pp{self.stage_of(rank)}"

    def nic_of_gpu(self, gpu: int) -> int:
        return gpu * self.nics_per_node // self.gpus_per_node

    # ---------------------------------------------------------------- derived knobs
    @property
    def eval_pause(self) -> float:
        return 3.0 * self.step_seconds if self.eval_seconds is None else self.eval_seconds

    @property
    def checkpoint_pause(self) -> float:
        if self.checkpoint_seconds is None:
            return 6.0 * self.step_seconds
        return self.checkpoint_seconds

    @property
    def gc_pause(self) -> float:
        return 0.15 * self.step_seconds if self.gc_seconds is None else self.gc_seconds

    @property
    def init_pause(self) -> float:
        if self.init_seconds is None:
            return max(5.0, 5.0 * self.step_seconds)
        return self.init_seconds

    @property
    def hang_tail(self) -> float:
        if self.hang_tail_seconds is None:
            return max(180.0, 20.0 * self.step_seconds)
        return self.hang_tail_seconds

    def replace(self, **changes: object) -> Scenario:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def resolved(self, now: float | None = None) -> Scenario:
        """This scenario with ``start_ts`` fixed: now (or ``now``) if ``realtime``."""
        if not self.realtime:
            return self
        return self.replace(start_ts=time.time() if now is None else now, realtime=False)


def resolve_all(scenarios: Sequence[Scenario], now: float | None = None) -> tuple[Scenario, ...]:
    """Fix the start of every realtime scenario to one clock reading.

    Call this once and pass the result to both :func:`simulate` and
    :func:`ground_truth` so their timestamps agree.
    """
    clock = time.time() if now is None else now
    return tuple(s.resolved(clock) for s in scenarios)


@dataclass(frozen=True)
class Target:
    """Where a fault lands once resolved against a scenario."""

    index: int  # position of the fault in Scenario.faults
    fault: Fault
    ranks: tuple[int, ...]  # affected ranks (empty: the whole job)
    host: str | None
    gpu: int | None
    nics: tuple[int, ...] = field(default=())  # NIC indices on ``host``
