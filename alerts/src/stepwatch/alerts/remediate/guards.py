"""The guardrails, in the order they are checked. Pure reads of the state.

Each check returns a :class:`Verdict` (``skip`` is the audit's ``reason``).
:func:`precheck` needs no scheduler call and runs first; :func:`node_checks`
and :func:`job_check` judge what the scheduler said; :func:`breaker_check`
runs last. Queued actions count: they reserve their place (see
:mod:`.state`). ``exclude_ref`` leaves out one alert's own rows, so
approving a queued action judges it as the one candidate it is.

Dry-run decisions are judged by the same checks but leave no history, so
observe mode never blocks a later execute mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepwatch.alerts.remediate.actuators.base import NodeState
from stepwatch.alerts.remediate.model import Alert
from stepwatch.alerts.remediate.policy import Guardrails
from stepwatch.alerts.remediate.state import State

DRAIN, REMEDIATION, ATTEMPT, NOTIFY = "drain", "remediation", "attempt", "notify"
PAGE = "page"


@dataclass(frozen=True)
class Verdict:
    """``skip``: why not to act (None: go ahead). ``escalate``: page a person.
    ``trip``: open the breaker.

    ``transient``: the reason may pass by itself (the scheduler did not answer, the
    job is pending): such a skip is not remembered, the next webhook asks again.
    """

    skip: str | None = None
    escalate: bool = False
    trip: bool = False
    detail: str = ""
    transient: bool = False


GO = Verdict()


def breaker_cap(g: Guardrails, cluster_nodes: int) -> int:
    """Nodes that may be drained within the breaker window: the share of the cluster,
    at least one."""
    return max(1, math.floor(g.breaker_max_share * cluster_nodes))


def precheck(
    state: State, g: Guardrails, alert: Alert, *, now: float, exclude_ref: str | None = None
) -> Verdict:
    """Everything that needs no scheduler call: breaker, opt-out, history and limits."""
    host, job = alert.host, alert.job_id
    if state.breaker().open:
        return Verdict("breaker_open")
    if host in g.opt_out_nodes or alert.labels.get(g.opt_out_label, "").lower() == "true":
        return Verdict("opted_out")
    done = state.remediations  # alerts remediated or queued, one per alert
    if done(now - g.repeat_window_s, node=host, exclude_ref=exclude_ref) >= g.repeat_count:
        return Verdict(
            "repeat_offender",
            escalate=True,
            detail=f"{g.repeat_count} remediations of {host} within the window",
        )
    if g.node_cooldown_s and done(now - g.node_cooldown_s, node=host, exclude_ref=exclude_ref):
        return Verdict("node_cooldown")
    if (
        job
        and g.job_cooldown_s
        and done(now - g.job_cooldown_s, job_id=job, exclude_ref=exclude_ref)
    ):
        return Verdict("job_cooldown")
    if done(now - g.rate_window_s, exclude_ref=exclude_ref) >= g.rate_limit:
        return Verdict("rate_limited")
    if state.count(ATTEMPT, now - g.attempt_window_s, node=host) >= g.attempts_per_node:
        return Verdict("attempt_budget", escalate=True)
    return GO


def node_checks(node: NodeState) -> Verdict:
    if not node.exists:
        return Verdict("unknown_node")
    if node.drained and not node.drained_by_stepwatch:
        return Verdict("drained_by_person", detail=node.reason[:200])
    return GO


def job_check(g: Guardrails, host: str, job_id: str, nodes: frozenset[str] | None) -> Verdict:
    """The alert's node must be one the scheduler says its job runs on."""
    if nodes is None:
        if g.unverified_jobs == "skip":
            return Verdict("job_unverifiable", detail="the actuator cannot list a job's nodes")
        return GO
    if not nodes:
        return Verdict(
            "job_not_running", detail=f"job {job_id} runs on no node now", transient=True
        )
    if host not in nodes:
        return Verdict("node_not_in_job", detail=f"job {job_id} runs on {len(nodes)} other node(s)")
    return GO


def breaker_check(
    state: State,
    g: Guardrails,
    host: str,
    node: NodeState,
    *,
    cluster_nodes: int,
    now: float,
    exclude_ref: str | None = None,
) -> Verdict:
    """Distinct nodes drained (or queued for a drain) in the window, this one included."""
    if node.drained:
        return GO  # draining a drained node again takes nothing more out
    drained = state.drained_nodes(now - g.breaker_window_s, exclude_ref=exclude_ref)
    cap = breaker_cap(g, cluster_nodes)
    if len(drained | {host}) > cap:
        return Verdict(
            "breaker_tripped",
            escalate=True,
            trip=True,
            detail=f"{len(drained)} of {cluster_nodes} nodes drained or queued in the "
            f"window, cap {cap}",
        )
    return GO
