"""Discrete events of a simulated job: start/end, checkpoints, XIDs, ECC, link changes."""

from __future__ import annotations

from stepwatch.contract import EventMessage, EventType
from stepwatch.sim import hardware as hw
from stepwatch.sim.scenario import Scenario

XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU.",
}


def job_start(sc: Scenario) -> EventMessage:
    return EventMessage(
        host=sc.host_of(0),
        ts=sc.start_ts,
        type=EventType.JOB_START,
        job_id=sc.job_id,
        rank=0,
        detail="started",
        attrs={
            "world_size": sc.world_size,
            "nodes": sc.nodes,
            "gpus_per_node": sc.gpus_per_node,
            "pipeline_stages": sc.pipeline_stages,
            "steps": sc.steps,
        },
    )


def restart(sc: Scenario) -> EventMessage:
    """A restart from the checkpoint before ``sc.first_step``, on the hosts it now has."""
    return EventMessage(
        host=sc.host_of(0),
        ts=sc.start_ts + 0.001,
        type=EventType.RESTART,
        job_id=sc.job_id,
        rank=0,
        detail=f"restarted from the checkpoint at step {sc.first_step}",
        attrs={
            "step": sc.first_step,
            "incarnation": sc.incarnation,
            "nodes": ",".join(sc.host_names),
        },
    )


def job_end(sc: Scenario, ts: float, code: int, detail: str) -> EventMessage:
    return EventMessage(
        host=sc.host_of(0),
        ts=ts,
        type=EventType.JOB_END,
        job_id=sc.job_id,
        rank=0,
        code=code,
        detail=detail,
    )


def checkpoint_save(sc: Scenario, ts: float, step: int, seconds: float) -> EventMessage:
    return EventMessage(
        host=sc.host_of(0),
        ts=ts,
        type=EventType.CHECKPOINT_SAVE,
        job_id=sc.job_id,
        rank=0,
        detail=f"checkpoint saved at step {step}",
        attrs={"step": step, "seconds": round(seconds, 3)},
    )


def xid(sc: Scenario, ts: float, rank: int, code: int) -> EventMessage:
    gpu = rank % sc.gpus_per_node
    bus = hw.pci_bus_id(gpu)
    return EventMessage(
        host=sc.host_of(rank),
        ts=ts,
        type=EventType.XID,
        job_id=sc.job_id,
        rank=rank,
        gpu=gpu,
        code=code,
        detail=f"NVRM: Xid (PCI:{bus[4:]}): {code}, {XID_TEXT.get(code, '')}",
        attrs={"pci_bus_id": bus, "uuid": hw.gpu_uuid(sc.host_of(rank), gpu)},
    )


def ecc_dbe(sc: Scenario, ts: float, rank: int) -> EventMessage:
    gpu = rank % sc.gpus_per_node
    return EventMessage(
        host=sc.host_of(rank),
        ts=ts,
        type=EventType.ECC,
        job_id=sc.job_id,
        rank=rank,
        gpu=gpu,
        code=1,
        detail="double_bit",
        attrs={"counter": "volatile", "location": "device_memory"},
    )


def link_flap(sc: Scenario, host: str, nic: int, down: float, up: float) -> list[EventMessage]:
    device = hw.nic_device(nic)
    common = {
        "host": host,
        "type": EventType.LINK_STATE,
        "job_id": sc.job_id,
        "device": device,
        "port": 1,
    }
    return [
        EventMessage(
            ts=down,
            detail="ACTIVE->DOWN",
            attrs={"state": "DOWN", "phys_state": "Polling"},
            **common,  # type: ignore[arg-type]
        ),
        EventMessage(
            ts=up,
            detail="DOWN->ACTIVE",
            attrs={"state": "ACTIVE", "phys_state": "LinkUp"},
            **common,  # type: ignore[arg-type]
        ),
    ]


def nan_exception(sc: Scenario, ts: float, step: int) -> EventMessage:
    rank = sc.world_size - sc.world_size // sc.pipeline_stages  # first rank of the last stage
    return EventMessage(
        host=sc.host_of(rank),
        ts=ts,
        type=EventType.EXCEPTION,
        job_id=sc.job_id,
        rank=rank,
        gpu=rank % sc.gpus_per_node,
        code=1,
        detail=f"FloatingPointError: loss is nan at step {step}",
        attrs={"exception": "FloatingPointError", "step": step, "user_code": True},
    )
