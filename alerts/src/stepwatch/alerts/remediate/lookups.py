"""What the scheduler says, asked at most once per webhook (or approval) per node and job.

A webhook that names one job in a hundred alerts costs one ``scontrol show
job``; a failed answer is remembered for the rest of the webhook too. What
Prometheus fires (``confirmations``, when the policy asks) is kept the same way.
"""

from __future__ import annotations

from stepwatch.alerts.remediate.actuators.base import Actuator, NodeState
from stepwatch.alerts.remediate.confirm import Confirmations
from stepwatch.errors import ActuatorError


class Lookups:
    def __init__(
        self,
        actuator: Actuator,
        cluster_nodes: int = 0,
        confirmations: Confirmations | None = None,
    ) -> None:
        self.actuator = actuator
        self.confirmations = confirmations
        self._cluster = cluster_nodes or None
        self._nodes: dict[str, NodeState | ActuatorError] = {}
        self._jobs: dict[str, frozenset[str] | ActuatorError | None] = {}
        self._owners: dict[str, str | ActuatorError] = {}

    def node_state(self, node: str) -> NodeState:
        if node not in self._nodes:
            try:
                self._nodes[node] = self.actuator.node_state(node)
            except ActuatorError as err:
                self._nodes[node] = err
        found = self._nodes[node]
        if isinstance(found, ActuatorError):
            raise found
        return found

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        if job_id not in self._jobs:
            try:
                self._jobs[job_id] = self.actuator.job_nodes(job_id)
            except ActuatorError as err:
                self._jobs[job_id] = err
        found = self._jobs[job_id]
        if isinstance(found, ActuatorError):
            raise found
        return found

    def job_owner(self, job_id: str) -> str:
        if job_id not in self._owners:
            try:
                self._owners[job_id] = self.actuator.job_owner(job_id)
            except ActuatorError as err:
                self._owners[job_id] = err
        found = self._owners[job_id]
        if isinstance(found, ActuatorError):
            raise found
        return found

    def cluster_nodes(self) -> int:
        if self._cluster is None:
            try:
                self._cluster = self.actuator.node_count()
            except ActuatorError:
                self._cluster = 0  # unknown size: the cap is one node
        return self._cluster
