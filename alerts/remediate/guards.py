"""The guardrails, in the order they are checked. Pure reads of the state.

Each check returns a skip reason (a short code, the audit's ``reason``) or
None. Dry-run decisions are judged by the same checks but leave no history,
so observe mode never blocks a later execute mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepwatch.alerts.remediate.actuators.base import NodeState
from stepwatch.alerts.remediate.model import Alert
from stepwatch.alerts.remediate.policy import Guardrails
from stepwatch.alerts.remediate.state import State

DRAIN, REMEDIATION, ATTEMPT = "drain", "remediation", "attempt"


@dataclass(frozen=True)
class Verdict:
    """``skip``: why not to act (None: go ahead). ``escalate``: page a person. ``trip``: open the breaker."""

    skip: str | None = None
    escalate: bool = False
    trip: bool = False
    detail: str = ""


GO = Verdict()


def breaker_cap(g: Guardrails, cluster_nodes: int) -> int:
    """Drains allowed within the breaker window: the share of the cluster, at least one."""
    return max(1, math.floor(g.breaker_max_share * cluster_nodes))


def judge(state: State, g: Guardrails, alert: Alert, node: NodeState, *, drains: bool,
          cluster_nodes: int, now: float) -> Verdict:
    host, job = alert.host, alert.job_id
    if state.breaker().open:
        return Verdict("breaker_open")
    if host in g.opt_out_nodes or alert.labels.get(g.opt_out_label, "").lower() == "true":
        return Verdict("opted_out")
    if not node.exists:
        return Verdict("unknown_node")
    if node.drained and not node.drained_by_stepwatch:
        return Verdict("drained_by_person", detail=node.reason)
    if state.count(REMEDIATION, now - g.repeat_window_s, node=host) >= g.repeat_count:
        return Verdict("repeat_offender", escalate=True,
                       detail=f"{g.repeat_count} remediations of {host} within the window")
    if g.node_cooldown_s and state.count(REMEDIATION, now - g.node_cooldown_s, node=host):
        return Verdict("node_cooldown")
    if job and g.job_cooldown_s and state.count(REMEDIATION, now - g.job_cooldown_s, job_id=job):
        return Verdict("job_cooldown")
    if state.count(REMEDIATION, now - g.rate_window_s) >= g.rate_limit:
        return Verdict("rate_limited")
    if state.count(ATTEMPT, now - g.attempt_window_s, node=host) >= g.attempts_per_node:
        return Verdict("attempt_budget", escalate=True)
    if drains and not node.drained:
        cap = breaker_cap(g, cluster_nodes)
        drained = state.count(DRAIN, now - g.breaker_window_s)
        if drained + 1 > cap:
            return Verdict("breaker_tripped", escalate=True, trip=True,
                           detail=f"{drained} of {cluster_nodes} nodes drained in the window, cap {cap}")
    return GO
