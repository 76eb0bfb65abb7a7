"""Who this training process is: job, rank, host, GPU and peer group.

Detected from the launcher's environment, overridable:
explicit argument > ``STEPWATCH_*`` env var > launcher env (torchrun, Slurm,
Kubernetes) > default. Detection never raises: a malformed variable is logged
once and skipped. The result is a frozen :class:`Identity`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stepwatch.logs import LogOnce

logger = logging.getLogger(__name__)
_log_once = LogOnce(logger)

UNKNOWN_JOB = "unknown"
# Kubeflow PyTorchJob pods are named <job>-master-0, <job>-worker-3.
_PYTORCHJOB_POD = re.compile(r"^(?P<job>.+)-(?:master|worker)-\d+$")


class Launcher(enum.StrEnum):
    """Which launcher's environment supplied the rank."""

    EXPLICIT = "explicit"  # an argument or STEPWATCH_RANK
    TORCHRUN = "torchrun"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    NONE = "none"  # a single process started by hand


@dataclass(frozen=True)
class Identity:
    """A training process's place in its job; copied into every StepRecord."""

    job_id: str = UNKNOWN_JOB
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    host: str = ""
    gpu: int | None = None
    group: str = "all"
    launcher: Launcher = Launcher.NONE
    pod: str = ""
    namespace: str = ""

    def replace(self, **changes: Any) -> Identity:
        return dataclasses.replace(self, **changes)


# field -> (STEPWATCH_* name, launcher variables in order of preference)
_INT_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "rank": ("STEPWATCH_RANK", ("RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX")),
    "world_size": ("STEPWATCH_WORLD_SIZE", ("WORLD_SIZE", "SLURM_NTASKS")),
    "local_rank": ("STEPWATCH_LOCAL_RANK", ("LOCAL_RANK", "SLURM_LOCALID")),
    "local_world_size": (
        "STEPWATCH_LOCAL_WORLD_SIZE",
        ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    ),
    "node_rank": ("STEPWATCH_NODE_RANK", ("GROUP_RANK", "SLURM_NODEID")),
}
_INT_DEFAULTS = {"rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1, "node_rank": 0}
_RANK_LAUNCHER = {
    "RANK": Launcher.TORCHRUN,
    "SLURM_PROCID": Launcher.SLURM,
    "JOB_COMPLETION_INDEX": Launcher.KUBERNETES,
}


def detect_identity(
    env: Mapping[str, str] | None = None,
    *,
    hostname: Callable[[], str] = socket.gethostname,
    **explicit: Any,
) -> Identity:
    """Build the identity: ``explicit`` (non-None) > STEPWATCH_* > launcher env > default."""
    environ = os.environ if env is None else env
    wanted = {f.name for f in dataclasses.fields(Identity)}
    for name in sorted(set(explicit) - wanted):
        _log_once(f"unknown:{name}", "stepwatch identity: unknown field=%s ignored", name)
    values: dict[str, Any] = {}
    launcher = Launcher.NONE
    for name, (own, launchers) in _INT_SOURCES.items():
        value, source = _first_int(name, explicit.get(name), environ, (own, *launchers))
        values[name] = _INT_DEFAULTS[name] if value is None else value
        if name == "rank" and source is not None:
            launcher = _RANK_LAUNCHER.get(source, Launcher.EXPLICIT)
    pod = environ.get("POD_NAME", "")
    values["pod"] = pod
    values["namespace"] = environ.get("POD_NAMESPACE", "")
    values["job_id"] = _job_id(explicit.get("job_id"), environ, pod)
    values["host"] = _text(explicit.get("host")) or _host(environ, hostname)
    values["group"] = _text(explicit.get("group")) or environ.get("STEPWATCH_GROUP") or "all"
    gpu, _ = _first_int("gpu", explicit.get("gpu"), environ, ("STEPWATCH_GPU",))
    values["gpu"] = gpu if gpu is not None else _visible_gpu(environ, values["local_rank"])
    if launcher is Launcher.NONE and _in_kubernetes(environ):
        launcher = Launcher.KUBERNETES
    values["launcher"] = launcher
    return _consistent(Identity(**values))


def _first_int(
    name: str, explicit: Any, environ: Mapping[str, str], names: tuple[str, ...]
) -> tuple[int | None, str | None]:
    """The first readable non-negative integer among explicit, then env ``names``."""
    if explicit is not None:
        value = _to_int(explicit)
        if value is not None:
            return value, "explicit"
        _log_once(
            f"bad:{name}",
            "stepwatch identity: ignoring %s=%r (not an integer >= 0)",
            name,
            explicit,
        )
    for var in names:
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        value = (
            _slurm_tasks_here(raw, environ.get("SLURM_NODEID"))
            if var == "SLURM_TASKS_PER_NODE"
            else _to_int(raw)
        )
        if value is not None:
            return value, var
        _log_once(
            f"bad:{var}", "stepwatch identity: ignoring env %s=%r (not an integer >= 0)", var, raw
        )
    return None, None


def _to_int(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    text = str(raw).strip()
    # SLURM_TASKS_PER_NODE reads "8(x2)": eight tasks on each of two nodes.
    match = re.match(r"^(\d+)(?:\(x\d+\))?$", text)
    return int(match.group(1)) if match else None


def torchrun_job_id(environ: Mapping[str, str]) -> str:
    """A job id for torchrun without ``--rdzv-id`` (its run id is ``none``): the address of
    the run's store, ``torchrun-<MASTER_ADDR>-<MASTER_PORT>``, which every rank of the
    run shares (the rank-0 agent's host name and a free port it picks, so the next run
    differs; torch 2.13 c10d, checked with two runs of two agents here). Not made
    host-specific where it is a loopback name: a host whose name resolves to
    ``localhost`` would then split a multi-node job into one per node. Before, every
    such job said ``unknown`` and all were analysed as one. "" when not such a run. The
    node agent derives the same id from a sender's environment (``env_jobs``)."""
    if environ.get("TORCHELASTIC_RUN_ID", "").strip() != "none":
        return ""
    addr = environ.get("MASTER_ADDR", "").strip()
    port = environ.get("MASTER_PORT", "").strip()
    if not addr or not port.isdigit():
        return ""
    return f"torchrun-{addr}-{port}"


def _slurm_tasks_here(raw: str, node_id: str | None) -> int | None:
    """This node's task count from Slurm's compressed ``SLURM_TASKS_PER_NODE``: ``8(x2)`` is
    eight on each of two nodes, ``2(x3),1`` two on each of the first three and one on the
    fourth (a heterogeneous allocation). The entry at ``SLURM_NODEID``; without it, the one
    count all nodes share (None where they differ). Before, only the uniform form was
    read: ``2(x3),1`` was ignored and each rank said one task per node."""
    runs: list[tuple[int, int]] = []  # (tasks, nodes)
    for part in str(raw).strip().split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        runs.append((int(match.group(1)), int(match.group(2) or 1)))
    here = _to_int(node_id) if node_id else None
    if here is None:
        return runs[0][0] if len({tasks for tasks, _ in runs}) == 1 else None
    for tasks, nodes in runs:
        if here < nodes:
            return tasks
        here -= nodes
    return None


def _text(raw: Any) -> str:
    return "" if raw is None else str(raw).strip()


def _job_id(explicit: Any, environ: Mapping[str, str], pod: str) -> str:
    for candidate in (
        _text(explicit),
        environ.get("STEPWATCH_JOB_ID", ""),
        environ.get("SLURM_JOB_ID", ""),
        environ.get("TORCHELASTIC_RUN_ID", ""),
    ):
        candidate = candidate.strip()
        if candidate and candidate != "none":  # torchrun's default run id is "none"
            return candidate
    match = _PYTORCHJOB_POD.match(pod)
    if match:
        namespace = environ.get("POD_NAMESPACE", "")
        return f"{namespace}/{match.group('job')}" if namespace else match.group("job")
    rendezvous = torchrun_job_id(environ)
    if rendezvous:
        _log_once(
            "rendezvous_job_id",
            "stepwatch identity: torchrun without --rdzv-id; job id %r from its store's "
            "address (set --rdzv-id or STEPWATCH_JOB_ID for a stable one)",
            rendezvous,
        )
        return rendezvous
    _log_once(
        "no_job_id",
        "stepwatch identity: no job id found; set STEPWATCH_JOB_ID "
        "or pass init(job_id=...) (using %r)",
        UNKNOWN_JOB,
    )
    return UNKNOWN_JOB


def _host(environ: Mapping[str, str], hostname: Callable[[], str]) -> str:
    for var in ("STEPWATCH_HOST", "SLURMD_NODENAME", "NODE_NAME"):
        value = environ.get(var, "").strip()
        if value:
            return value
    try:
        return hostname()
    except OSError:
        return "localhost"


def _visible_gpu(environ: Mapping[str, str], local_rank: int) -> int | None:
    """The physical GPU index: CUDA_VISIBLE_DEVICES[local_rank] when readable."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    # isdigit() alone took "²" and other non-ASCII digits, which int() refuses: the
    # ValueError cost the whole identity (job "unknown", rank 0), explicit arguments too
    if not visible or not all(v.isascii() and v.isdigit() for v in visible):
        return None  # absent or UUIDs: the GPU index defaults to local_rank downstream
    if len(visible) == 1:
        return int(visible[0])  # one GPU bound to this task (Slurm --gpus-per-task)
    return int(visible[local_rank]) if local_rank < len(visible) else None


def _in_kubernetes(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST") or environ.get("POD_NAME"))


def _consistent(identity: Identity) -> Identity:
    changes: dict[str, Any] = {}
    if identity.world_size < 1:
        changes["world_size"] = 1
    if identity.rank >= max(identity.world_size, 1):
        _log_once(
            "rank_ge_world",
            "stepwatch identity: rank=%s >= world_size=%s; using "
            "world_size=%s (set STEPWATCH_WORLD_SIZE)",
            identity.rank,
            identity.world_size,
            identity.rank + 1,
        )
        changes["world_size"] = identity.rank + 1
    if identity.local_world_size < 1:
        changes["local_world_size"] = 1
    return identity.replace(**changes) if changes else identity
