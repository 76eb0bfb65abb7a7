"""Ground truth: what each injected fault should make a detector say.

Every fault maps to one expected detection type, one cause and one fault class
(:data:`EXPECTED`); :func:`ground_truth` resolves the fault against its scenario
(ranks, host, GPU, NIC, the step and time it started and ended) by running the
same timing model :func:`~stepwatch.sim.simulate` runs, so timestamps agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgspec

from stepwatch.sim import hardware as hw
from stepwatch.sim.engine import rngs
from stepwatch.sim.scenario import FaultKind, Scenario, Target, resolve_all
from stepwatch.sim.timing import StepModel


class Detection(enum.StrEnum):
    STRAGGLER = "straggler"
    HANG = "hang"
    RANK_MISSING = "rank_missing"
    JOB_SLOWDOWN = "job_slowdown"
    USER_ERROR = "user_error"
    LINK_FLAP = (
        "link_flap"  # event-level: LINK_STATE events and link_downed (no step impact to speak of)
    )


class Cause(enum.StrEnum):
    GPU = "gpu"
    NETWORK = "network"
    HOST_INPUT = "host_input"
    HARDWARE = "hardware"
    USER = "user"
    UNKNOWN = "unknown"


class FaultClass(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"


@dataclass(frozen=True)
class Expected:
    detection: Detection
    cause: Cause
    fault_class: FaultClass
    action: str  # what an operator should do: inspect | drain | restart | notify_user
    accepted: tuple[Detection, ...] = ()  # other detection types that also count as a hit


S, D, C = FaultClass.SYSTEM, Detection, Cause
EXPECTED: dict[FaultKind, Expected] = {
    FaultKind.SLOW_GPU: Expected(D.STRAGGLER, C.GPU, S, "inspect", (D.JOB_SLOWDOWN,)),
    FaultKind.THERMAL_THROTTLE: Expected(D.STRAGGLER, C.GPU, S, "inspect", (D.JOB_SLOWDOWN,)),
    FaultKind.POWER_THROTTLE: Expected(D.STRAGGLER, C.GPU, S, "inspect", (D.JOB_SLOWDOWN,)),
    FaultKind.NIC_CONGESTION: Expected(D.STRAGGLER, C.NETWORK, S, "inspect", (D.JOB_SLOWDOWN,)),
    FaultKind.LINK_FLAP: Expected(D.LINK_FLAP, C.NETWORK, S, "inspect"),
    FaultKind.XID79: Expected(D.RANK_MISSING, C.HARDWARE, S, "drain", (D.HANG,)),
    FaultKind.XID48: Expected(D.RANK_MISSING, C.HARDWARE, S, "drain", (D.HANG,)),
    FaultKind.DATALOADER_STALL: Expected(
        D.STRAGGLER, C.HOST_INPUT, S, "inspect", (D.JOB_SLOWDOWN,)
    ),
    FaultKind.JOB_HANG: Expected(D.HANG, C.UNKNOWN, S, "restart"),
    FaultKind.RANK_CRASH: Expected(D.RANK_MISSING, C.UNKNOWN, S, "restart", (D.HANG,)),
    FaultKind.SLOW_RANK: Expected(D.STRAGGLER, C.GPU, S, "inspect", (D.JOB_SLOWDOWN,)),
    FaultKind.NAN_LOSS: Expected(D.USER_ERROR, C.USER, FaultClass.USER, "notify_user"),
}
del S, D, C


class Label(msgspec.Struct, frozen=True, kw_only=True):
    """One injected fault as a detector should report it (JSON: :meth:`to_dict`)."""

    job_id: str
    kind: str  # FaultKind value
    detection: str  # expected detection type (Detection value)
    accepted: tuple[str, ...] = ()  # other detection types that count as a hit
    cause: str
    fault_class: str  # system | user
    action: str
    ranks: tuple[int, ...] = ()  # affected ranks; empty: the whole job
    rank: int | None = None  # the one rank, when exactly one is affected
    host: str | None = None
    gpu: int | None = None
    device: str | None = None  # NIC device for network faults (mlx5_N)
    port: int | None = None
    group: str | None = None  # peer group of the affected ranks, when they share one
    severity: float = 0.0
    start_step: int
    start_ts: float
    end_step: int | None = None  # first step no longer affected; None: to the end
    end_ts: float | None = None
    summary: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (lists, not tuples)."""
        plain: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(self))
        return plain


def ground_truth(*scenarios: Scenario) -> list[Label]:
    """Labels of every fault that took effect, ordered by start time."""
    labels: list[Label] = []
    for sc in resolve_all(scenarios):
        model = StepModel(sc, rngs(sc)[0])
        model.run()
        for target in model.targets:
            mark = model.marks.get(target.index)
            if mark is not None:
                labels.append(_label(sc, target, mark))
    labels.sort(key=lambda label: (label.start_ts, label.job_id))
    return labels


def _label(sc: Scenario, target: Target, mark: tuple[float, float | None]) -> Label:
    fault, exp = target.fault, EXPECTED[target.fault.kind]
    groups = {sc.group_of(r) for r in target.ranks}
    nics = target.nics
    end_step = fault.end_step
    if fault.kind is FaultKind.LINK_FLAP:
        end_step = fault.start_step + 1
    elif end_step is not None and mark[1] is None:
        end_step = None  # the job ended (or stopped) before the fault did
    where = (
        f"rank {target.ranks[0]}"
        if len(target.ranks) == 1
        else (f"host {target.host}" if target.host else "the job")
    )
    device = hw.nic_device(nics[0]) if len(nics) == 1 else None
    return Label(
        job_id=sc.job_id,
        kind=fault.kind.value,
        detection=exp.detection.value,
        accepted=tuple(d.value for d in exp.accepted),
        cause=exp.cause.value,
        fault_class=exp.fault_class.value,
        action=exp.action,
        ranks=target.ranks,
        rank=target.ranks[0] if len(target.ranks) == 1 else None,
        host=target.host,
        gpu=target.gpu,
        device=device,
        port=1 if nics else None,
        group=groups.pop() if len(groups) == 1 else None,
        severity=fault.severity,
        start_step=fault.start_step,
        start_ts=round(mark[0], 6),
        end_step=end_step,
        end_ts=None if mark[1] is None else round(mark[1], 6),
        summary=f"{fault.kind.value} on {where} from step {fault.start_step}",
    )
