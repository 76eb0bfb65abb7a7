"""The Protocols every backend implements, and the log-only backends."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

REASON_PREFIX = (
    "stepwatch"  # every drain reason starts with this: how we tell our drains from a person's
)


@dataclass(frozen=True)
class NodeState:
    """What the scheduler says about a node: out of service (drained, cordoned, down, failed,
    in maintenance) and why."""

    exists: bool
    drained: bool
    reason: str = ""

    @property
    def drained_by_stepwatch(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)


class Actuator(Protocol):
    """Acts on the scheduler. Raises ``ActuatorError(transient=...)`` on failure.

    Every method is idempotent: draining a drained node or excluding an
    excluded node again is a success.
    """

    name: str

    def node_state(self, node: str) -> NodeState: ...

    def node_count(self) -> int: ...

    def drain(self, node: str, reason: str) -> str: ...

    def requeue(self, job_id: str, exclude_node: str) -> str: ...

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        """The nodes the job runs on now (empty: none, e.g. pending); None: cannot tell."""
        ...

    def job_owner(self, job_id: str) -> str:
        """The user who owns the job ('' when the backend cannot tell)."""
        ...


class Notifier(Protocol):
    """Sends a message to a person (the job's owner, the on-call)."""

    def send(self, event: Mapping[str, Any]) -> None: ...


class LogActuator:
    """Records what it would do in the log; the cluster is ``nodes`` nodes, none drained.

    ``jobs`` (job id -> node names), when given, is where jobs run; without it the
    log backend cannot tell (``job_nodes`` is None).
    """

    name = "log"

    def __init__(self, nodes: int = 0, jobs: Mapping[str, Any] | None = None) -> None:
        self.nodes = nodes
        self.drained: dict[str, str] = {}
        self.jobs = (
            None if jobs is None else {str(k): frozenset(map(str, v)) for k, v in jobs.items()}
        )

    def node_state(self, node: str) -> NodeState:
        return NodeState(True, node in self.drained, self.drained.get(node, ""))

    def node_count(self) -> int:
        return self.nodes

    def drain(self, node: str, reason: str) -> str:
        self.drained[node] = reason
        log.info("log actuator drain node=%s reason=%s", node, reason)
        return f"drain {node} logged"

    def requeue(self, job_id: str, exclude_node: str) -> str:
        log.info("log actuator requeue job_id=%s exclude=%s", job_id, exclude_node)
        return f"requeue {job_id} logged"

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        return None if self.jobs is None else self.jobs.get(job_id, frozenset())

    def job_owner(self, job_id: str) -> str:
        return ""


class LogNotifier:
    def send(self, event: Mapping[str, Any]) -> None:
        log.warning(
            "notification kind=%s to=%s summary=%s",
            event.get("kind"),
            event.get("to"),
            event.get("summary"),
        )
