"""Small synthetic jobs for the detection-core tests, shaped like synchronous training.

Every rank works (data + forward + backward + optimizer), then waits in the
gradient all-reduce for the slowest rank: all ranks start and end each step
together, and ``comm_wait = step - own work - pause``. Knobs make a rank, a
group or the whole job slower, add pauses (every rank) and single slow steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from stepwatch.contract import (
    DetectionMessage,
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
from stepwatch.streams.core import Engine

T0 = 1_767_225_600.0
SHARES = (0.01, 0.30, 0.55, 0.06)  # data, forward, backward, optimizer of a 1 s step
COMM = 0.08


@dataclass
class Job:
    world: int = 16
    steps: int = 60
    job_id: str = "job-t"
    per_host: int = 8
    step_s: float = 1.0
    jitter: float = 0.01
    seed: int = 0
    stages: int = 1
    stage_weights: tuple[float, ...] = ()
    slow: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (from, factor)
    slow_data: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (from, +s)
    job_factor: Callable[[int], float] = lambda s: 1.0
    group_factor: dict[str, tuple[int, float]] = field(default_factory=dict)
    pauses: dict[int, float] = field(default_factory=dict)  # step -> seconds (every rank)
    single: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, step) -> factor
    phases: bool = True
    stop_at: int | None = None  # no records from this step on
    crashed: int | None = None  # this rank has no record at step stop_at - 1
    nan_from: int | None = None
    flops: float | None = None
    samples: int = 4
    tokens: int = 4096

    def host(self, rank: int) -> str:
        return f"h{rank // self.per_host:03d}"

    def group(self, rank: int) -> str:
        if self.stages == 1:
            return "all"
        return f"pp{rank * self.stages // self.world}"

    def hosts(self) -> list[str]:
        return sorted({self.host(r) for r in range(self.world)})

    def messages(self) -> list[StepMessage]:
        """One StepMessage per host per step, in time order."""
        rng = np.random.default_rng(self.seed)
        out: list[StepMessage] = []
        t = T0
        for s in range(self.steps):
            if self.stop_at is not None and s >= self.stop_at:
                break
            mult = np.exp(self.jitter * rng.standard_normal(self.world)) * self.job_factor(s)
            data = np.full(self.world, SHARES[0] * self.step_s)
            for r in range(self.world):
                g = self.group(r)
                if self.stage_weights:
                    mult[r] *= self.stage_weights[int(g[2:])]
                if g in self.group_factor and s >= self.group_factor[g][0]:
                    mult[r] *= self.group_factor[g][1]
                if r in self.slow and s >= self.slow[r][0]:
                    mult[r] *= self.slow[r][1]
                if r in self.slow_data and s >= self.slow_data[r][0]:
                    data[r] += self.slow_data[r][1]
                mult[r] *= self.single.get((r, s), 1.0)
            fwd, bwd, opt = (self.step_s * share * mult for share in SHARES[1:])
            work = data + fwd + bwd + opt
            pause = self.pauses.get(s, 0.0)
            end = t + float(work.max()) + COMM * self.step_s + pause
            by_host: dict[str, list[StepRecord]] = {}
            for r in range(self.world):
                if self.crashed == r and self.stop_at is not None and s == self.stop_at - 1:
                    continue
                ph = None
                if self.phases:
                    ph = Phases(
                        data=float(data[r]),
                        forward=float(fwd[r]),
                        backward=float(bwd[r]),
                        optimizer=float(opt[r]),
                        comm_wait=float(end - t - work[r] - pause),
                        checkpoint=pause or None,
                    )
                nan = self.nan_from is not None and s >= self.nan_from
                rec = StepRecord(
                    job_id=self.job_id,
                    rank=r,
                    world_size=self.world,
                    step=s,
                    start=t,
                    end=end,
                    host=self.host(r),
                    local_rank=r % self.per_host,
                    group=self.group(r),
                    phases=ph,
                    samples=self.samples,
                    tokens=self.tokens,
                    loss=None if nan else 2.0,
                    loss_nonfinite=nan,
                    flops=self.flops,
                )
                by_host.setdefault(rec.host, []).append(rec)
            for h, recs in sorted(by_host.items()):
                out.append(StepMessage(host=h, ts=end + 0.2, job_id=self.job_id, steps=recs))
            t = end
        return out


def gpu_message(
    host: str,
    ts: float,
    over: Mapping[int, Mapping[str, object]] | None = None,
    *,
    n: int = 8,
    job_id: str | None = None,
) -> GpuMessage:
    """A healthy, busy H100 host; ``over={3: {...}}`` changes GPU 3's fields."""
    readings = []
    for i in range(n):
        fields: dict[str, object] = {
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "util_gpu_pct": 99.0,
            "temp_gpu_c": 60.0,
            "power_w": 600.0,
            "power_limit_w": 700.0,
            "sm_clock_mhz": 1980.0,
            "sm_clock_max_mhz": 1980.0,
            "throttle_reasons": 0,
            "ecc_dbe_total": 0,
            "remapped_rows_uncorrectable": 0,
        }
        fields.update((over or {}).get(i, {}))
        readings.append(GpuReading(**fields))  # type: ignore[arg-type]
    return GpuMessage(host=host, ts=ts, job_id=job_id, gpus=readings)


def port_message(
    host: str, ts: float, counters: Mapping[int, Mapping[str, object]] | None = None, n: int = 8
) -> PortMessage:
    """``counters[nic]`` sets cumulative counters / state of NIC ``nic``."""
    readings = []
    for i in range(n):
        fields: dict[str, object] = {
            "device": f"mlx5_{i}",
            "port": 1,
            "state": "ACTIVE",
            "xmit_wait_total": 1000,
            "np_cnp_sent_total": 10,
            "rp_cnp_handled_total": 10,
            "np_ecn_marked_roce_packets_total": 10,
            "symbol_error_total": 0,
            "link_downed_total": 1,
        }
        fields.update((counters or {}).get(i, {}))
        readings.append(PortReading(**fields))  # type: ignore[arg-type]
    return PortMessage(host=host, ts=ts, ports=readings)


def event(type_: EventType, host: str, ts: float, **kw: object) -> EventMessage:
    return EventMessage(host=host, ts=ts, type=type_, **kw)  # type: ignore[arg-type]


def shifted(messages: Sequence[StepMessage], by: float) -> list[StepMessage]:
    """Step messages ``by`` seconds later: the message time and every record's start/end."""
    return [
        msgspec.structs.replace(
            m,
            ts=m.ts + by,
            steps=[msgspec.structs.replace(r, start=r.start + by, end=r.end + by) for r in m.steps],
        )
        for m in messages
    ]


def interleave(steps: Sequence[Message], extra: Sequence[Message]) -> list[Message]:
    """Merge by timestamp (stable: steps first on ties)."""
    return sorted([*steps, *extra], key=lambda m: m.ts)


def with_cpu_times(
    messages: Sequence[StepMessage], wait_share: float, by_host: Mapping[str, float] | None = None
) -> list[StepMessage]:
    """CPU times for every record: half its busy time run on a CPU, and waiting for one
    ``wait_share`` of its runnable time (``by_host[host]`` for the ranks of those hosts). A
    slow rank's CPU time and wait grow alike: no extra wait."""
    out = []
    for m in messages:
        recs = []
        for r in m.steps:
            p = r.phases
            assert p is not None
            busy = (p.data or 0) + (p.forward or 0) + (p.backward or 0) + (p.optimizer or 0)
            share = (by_host or {}).get(r.host, wait_share)
            ran = 0.5 * busy
            recs.append(
                msgspec.structs.replace(r, cpu_time=ran, cpu_wait=ran * share / (1 - share))
            )
        out.append(msgspec.structs.replace(m, steps=recs))
    return out


def drive(
    engine: Engine, messages: Sequence[Message], until: float | None = None, tick: float = 1.0
) -> list[DetectionMessage]:
    """Feed messages like the replay does (tick on event time); then tick up to ``until``."""
    out: list[DetectionMessage] = []
    last = 0.0
    for m in messages:
        out.extend(engine.process(m))
        if m.ts - last >= tick:
            last = m.ts
            out.extend(engine.tick(m.ts))
    now = engine.now
    while until is not None and now < until:
        now = min(until, now + tick)
        out.extend(engine.tick(now))
    return out


def opened(detections: list[DetectionMessage], type_: str | None = None) -> list[DetectionMessage]:
    return [d for d in detections if d.state == "open" and (type_ is None or d.type == type_)]


def num(d: DetectionMessage, key: str) -> float:
    """A numeric evidence field (fails the test when absent or not a number)."""
    value = d.evidence[key]
    assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    return float(value)
