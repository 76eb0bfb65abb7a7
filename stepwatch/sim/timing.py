"""The per-step timing model of a synchronous data/pipeline-parallel job.

One :class:`StepBlock` per step holds every rank's phases as NumPy arrays (one
RNG draw per step for all ranks). The model:

* work_r = data + forward + backward + optimizer (+ slow-link transfer) varies
  per rank with lognormal noise, rare Pareto tails and GC pauses;
* the step ends for everyone when the slowest rank's work plus the exposed
  collective and any pause (evaluation, checkpoint) is done, so every rank's
  step wall time is the same up to sub-millisecond launch skew;
* comm_wait_r = step time - own work - pause: the slowest rank waits least.

Faults change the arrays (see docs/simulator.md); faults that stop the job
set :attr:`StepModel.stop`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import EventMessage
from stepwatch.sim import events as ev
from stepwatch.sim.scenario import STOPPING, FaultKind, Scenario, Target
from stepwatch.sim.targets import resolve_targets

# Shares of the nominal step (the heaviest pipeline stage, no noise).
DATA, FORWARD, BACKWARD, OPTIMIZER, COMM = 0.01, 0.30, 0.55, 0.06, 0.08
SLOW_COMPUTE = frozenset(
    {FaultKind.SLOW_GPU, FaultKind.THERMAL_THROTTLE, FaultKind.POWER_THROTTLE, FaultKind.SLOW_RANK}
)
NAN_STEPS = 3  # NaN-loss steps the job survives before it raises
FLAP_RETRY_SECONDS = 0.5  # NCCL retry / QP recovery after the link is back


class Outcome(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    HANG = "hang"  # every rank stopped, GPUs idle, processes alive
    CRASH = "crash"  # one rank died, its peers block (spinning) in a collective
    USER_ERROR = "user_error"  # the job raised and exited


@dataclass(frozen=True)
class Stop:
    outcome: Outcome
    step: int  # last step any rank emitted
    ts: float  # when progress stopped (hang/crash) or the job ended
    victims: tuple[int, ...] = ()
    gone: tuple[int, ...] = ()  # victims whose GPU left the bus (XID 79)


@dataclass(frozen=True, slots=True)
class StepBlock:
    """One step on every rank; arrays are indexed by rank."""

    step: int
    t0: float  # common start (before launch skew)
    t1: float  # common end
    emit: np.ndarray  # bool: the rank finished the step and reports it
    start: np.ndarray
    end: np.ndarray
    data: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    optimizer: np.ndarray
    transfer: np.ndarray  # slow-link transfer time (0 unless a NIC fault)
    comm_wait: np.ndarray
    evaluation: float
    checkpoint: np.ndarray
    loss: np.ndarray  # NaN: non-finite; only meaningful where has_loss


class StepModel:
    """Iterate to get the steps; ``events`` fills with the job's discrete events."""

    def __init__(self, scenario: Scenario, rng: np.random.Generator) -> None:
        sc = self.scenario = scenario
        self.rng = rng
        self.targets = resolve_targets(scenario)
        n = self.n = sc.world_size
        ranks = np.arange(n)
        stage = ranks // (n // sc.pipeline_stages)
        weights = np.ones(sc.pipeline_stages)
        if sc.pipeline_stages > 1:  # embedding on the first stage, head + loss on the last
            weights[0] *= 1.06
            weights[-1] *= 1.12
        self.stage_weight = (weights / weights.max())[stage]
        self.static = rng.normal(0.0, 0.003, n)  # silicon lottery, fixed per rank
        self.has_loss = stage == sc.pipeline_stages - 1
        self.events: list[EventMessage] = [ev.job_start(sc)]
        if sc.incarnation:
            self.events.append(ev.restart(sc))
        self.marks: dict[int, tuple[float, float | None]] = {}
        self.stop: Stop | None = None
        self.flap_windows: list[tuple[str, int, float, float]] = []  # host, nic, down, up
        self._skew = np.zeros(n)
        self._stopper = self._first_stopper()

    def _first_stopper(self) -> Target | None:
        stoppers = [t for t in self.targets if t.fault.kind in STOPPING]
        stoppers = [t for t in stoppers if t.fault.start_step < self.scenario.steps]
        return min(stoppers, key=lambda t: t.fault.start_step, default=None)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[StepBlock]:
        sc = self.scenario
        t = sc.start_ts + sc.init_pause
        for s in range(sc.first_step, sc.steps):
            stopper = self._stopper
            if (
                stopper
                and stopper.fault.kind is FaultKind.JOB_HANG
                and s == stopper.fault.start_step
            ):
                self.marks[stopper.index] = (t, None)
                self.stop = Stop(Outcome.HANG, s - 1, t)
                return
            block = self._step(s, t)
            t = block.t1
            yield block
            if self.stop is not None:
                return
        self.stop = Stop(Outcome.COMPLETED, sc.steps - 1, t + 0.5)
        self.events.append(ev.job_end(sc, t + 0.5, 0, "completed"))

    def run(self) -> Stop:
        """Run to the end without keeping the blocks (for the ground truth)."""
        for _ in self:
            pass
        assert self.stop is not None
        return self.stop

    # ------------------------------------------------------------------ one step
    def _step(self, s: int, t0: float) -> StepBlock:
        sc, n, rng = self.scenario, self.n, self.rng
        z = rng.standard_normal((6, n))  # compute, gc, data, fault, skew, loss
        u = rng.random((4, n))  # tail?, gc?, tail size, checkpoint share
        common = rng.standard_normal(4)
        base = sc.step_seconds
        since = s - sc.first_step  # a restart warms up again
        warm = 1.0 + 2.0 * (1.0 - since / sc.warmup_steps) ** 2 if since < sc.warmup_steps else 1.0
        mult = warm * self.stage_weight * np.exp(sc.jitter * z[0] + self.static + 0.004 * common[0])
        tail = (1.0 - u[2]) ** (-1.0 / 1.5) - 1.0  # Pareto(1.5) excess
        mult *= np.where(u[0] < sc.tail_prob, 1.0 + np.minimum(0.015 + 0.03 * tail, 0.4), 1.0)
        data = base * DATA * np.exp(0.5 * z[2] - 0.125)
        transfer = np.zeros(n)
        for target in self.targets:
            if target.fault.active(s):
                self._apply(target, s, t0, z[3], mult, data, transfer)
        gc = np.where(u[1] < sc.gc_prob, sc.gc_pause * np.exp(0.4 * z[1]), 0.0)
        forward = base * FORWARD * mult + gc
        backward = base * BACKWARD * mult
        optimizer = base * OPTIMIZER * mult
        work = data + forward + backward + optimizer + transfer
        comm = base * COMM * math.exp(0.05 * common[1])
        evaluation = self._eval_pause(s, common[2])
        ckpt = self._ckpt_pause(s, common[3])
        ckpt_r = ckpt * (1.0 - 0.002 * u[3]) if ckpt else np.zeros(n)
        t1 = t0 + float(work.max()) + comm + evaluation + ckpt
        skew = np.abs(z[4]) * 2e-4 * min(1.0, base)
        start, end = t0 + self._skew, t1 + skew
        self._skew = skew
        busy = work + evaluation + ckpt_r
        comm_wait = np.maximum(end - start - busy, 0.0)
        loss = self._loss(s, z[5])
        emit = np.ones(n, dtype=bool)
        block = StepBlock(
            s,
            t0,
            t1,
            emit,
            start,
            end,
            data,
            forward,
            backward,
            optimizer,
            transfer,
            comm_wait,
            evaluation,
            ckpt_r,
            loss,
        )
        if ckpt:
            self.events.append(ev.checkpoint_save(sc, t1 + 0.01, s, ckpt))
        self._maybe_stop(block)
        return block

    def _apply(
        self,
        target: Target,
        s: int,
        t0: float,
        noise: np.ndarray,
        mult: np.ndarray,
        data: np.ndarray,
        transfer: np.ndarray,
    ) -> None:
        fault, sc = target.fault, self.scenario
        idx = np.asarray(target.ranks, dtype=np.intp)
        if (
            s == fault.start_step
            and fault.kind not in STOPPING
            and fault.kind is not FaultKind.LINK_FLAP
        ):
            self.marks[target.index] = (t0, None)
        if fault.kind in SLOW_COMPUTE:
            mult[idx] *= 1.0 + fault.severity
        elif fault.kind is FaultKind.DATALOADER_STALL:
            data[idx] += fault.severity * sc.step_seconds * np.exp(0.4 * noise[idx] - 0.08)
        elif fault.kind is FaultKind.NIC_CONGESTION:
            transfer[idx] += fault.severity * sc.step_seconds * np.exp(0.25 * noise[idx] - 0.03)
        elif fault.kind is FaultKind.LINK_FLAP and s == fault.start_step:
            down = fault.duration_seconds or 3.0
            transfer[idx] += down + FLAP_RETRY_SECONDS
            at = t0 + 0.7 * sc.step_seconds
            self.marks[target.index] = (at, at + down)
            assert target.host is not None
            for nic in target.nics:
                self.flap_windows.append((target.host, nic, at, at + down))
                self.events.extend(ev.link_flap(sc, target.host, nic, at, at + down))

    def mark_ends(self, s: int, t0: float) -> None:
        for target in self.targets:
            fault = target.fault
            if fault.end_step == s and target.index in self.marks:
                self.marks[target.index] = (self.marks[target.index][0], t0)

    def _eval_pause(self, s: int, noise: float) -> float:
        sc = self.scenario
        if sc.eval_every and (s + 1) % sc.eval_every == 0 and s < sc.steps - 1:
            return sc.eval_pause * math.exp(0.02 * noise)
        return 0.0

    def _ckpt_pause(self, s: int, noise: float) -> float:
        sc = self.scenario
        if sc.checkpoint_every and (s + 1) % sc.checkpoint_every == 0:
            return sc.checkpoint_pause * math.exp(0.08 * noise)
        return 0.0

    def _loss(self, s: int, noise: np.ndarray) -> np.ndarray:
        tau = max(50.0, self.scenario.steps / 4.0)
        loss = 1.7 + 6.5 * math.exp(-s / tau) + 0.03 * noise
        for target in self.targets:
            if target.fault.kind is FaultKind.NAN_LOSS and s >= target.fault.start_step:
                loss[:] = np.nan
        return loss

    # ------------------------------------------------------------------ stopping
    def _maybe_stop(self, block: StepBlock) -> None:
        target, sc, s = self._stopper, self.scenario, block.step
        self.mark_ends(s, block.t0)
        if target is None:
            return
        fault = target.fault
        if fault.kind is FaultKind.NAN_LOSS:
            if s == fault.start_step:
                self.marks[target.index] = (block.t0, None)
            last = min(fault.start_step + NAN_STEPS - 1, sc.steps - 1)
            if s == last:
                raised = block.t1 + 0.05
                self.events.append(ev.nan_exception(sc, raised, s))
                self.events.append(ev.job_end(sc, raised + 0.5, 1, "error"))
                self.stop = Stop(Outcome.USER_ERROR, s, raised + 0.5)
            return
        if s != fault.start_step or fault.kind is FaultKind.JOB_HANG:
            return
        victim = target.ranks[0]
        block.emit[victim] = False  # died after the collective, before its end mark
        died = float(block.end[victim] - 0.5 * block.optimizer[victim])
        self.marks[target.index] = (died, None)
        gone: tuple[int, ...] = ()
        if fault.kind is FaultKind.XID79:
            self.events.append(ev.xid(sc, died, victim, 79))
            gone = (victim,)
        elif fault.kind is FaultKind.XID48:
            self.events.append(ev.ecc_dbe(sc, died - 0.001, victim))
            self.events.append(ev.xid(sc, died, victim, 48))
        self.stop = Stop(Outcome.CRASH, s, died, (victim,), gone)
