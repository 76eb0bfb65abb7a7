"""Actuators: the one interface the remediator acts through, and its backends.

:class:`~.base.Actuator` is the Protocol; ``slurm``, ``kube`` and ``command``
(a command line or a webhook) are sibling backends; :func:`build` picks one
from the policy's ``actuator`` block. Notifiers (the job owner, the pager)
share the command/webhook backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepwatch.alerts.remediate.actuators.base import Actuator, LogActuator, Notifier
from stepwatch.alerts.remediate.actuators.command import (
    CommandActuator,
    CommandNotifier,
    WebhookNotifier,
)
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.errors import ConfigError

__all__ = ["Actuator", "Notifier", "build", "build_notifier"]


def build(spec: Mapping[str, Any]) -> Actuator:
    kind = spec.get("kind")
    if kind == "slurm":
        return SlurmActuator(
            scontrol=str(spec.get("scontrol", "scontrol")),
            sinfo=str(spec.get("sinfo", "sinfo")),
            squeue=str(spec.get("squeue", "")),
            timeout=float(spec.get("timeout", 20.0)),
            conf=str(spec.get("slurm_conf", "")),
        )
    if kind == "kubernetes":
        from stepwatch.alerts.remediate.actuators.kube import KubeActuator

        return KubeActuator.from_config(spec)
    if kind == "command":
        return CommandActuator(
            argv=[str(a) for a in spec.get("argv", [])],
            timeout=float(spec.get("timeout", 30.0)),
            nodes=int(spec.get("nodes", 0)),
        )
    if kind == "log":
        jobs = spec.get("jobs")
        return LogActuator(
            nodes=int(spec.get("nodes", 0)), jobs=jobs if isinstance(jobs, Mapping) else None
        )
    raise ConfigError(f"unknown actuator kind {kind!r}")


def build_notifier(spec: Mapping[str, Any], token: str = "") -> Notifier:
    kind = spec.get("kind")
    if kind == "webhook":
        return WebhookNotifier(url=str(spec["url"]), timeout=float(spec.get("timeout", 10.0)))
    if kind == "command":
        return CommandNotifier(
            argv=[str(a) for a in spec.get("argv", [])], timeout=float(spec.get("timeout", 30.0))
        )
    if kind == "log":
        from stepwatch.alerts.remediate.actuators.base import LogNotifier

        return LogNotifier()
    raise ConfigError(f"unknown notifier kind {kind!r}")
