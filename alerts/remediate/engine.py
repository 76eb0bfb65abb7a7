"""Decide and act: one alert in, one audited decision per planned action out."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from stepwatch.alerts.remediate import guards
from stepwatch.alerts.remediate.actuators.base import Actuator, NodeState, Notifier
from stepwatch.alerts.remediate.audit import AuditSink
from stepwatch.alerts.remediate.model import (
    Action,
    ActionKind,
    Alert,
    AlertClass,
    Decision,
    Mode,
    Outcome,
    action_id,
)
from stepwatch.alerts.remediate.policy import Policy
from stepwatch.alerts.remediate.state import ActionRow, State, Status
from stepwatch.errors import ActuatorError

log = logging.getLogger(__name__)

_FINAL = {Status.DONE, Status.QUEUED, Status.DRY_RUN, Status.FAILED_PERMANENT, Status.REJECTED}
_MAX_REASON = 200


class Remediator:
    def __init__(self, policy: Policy, state: State, actuator: Actuator, owner: Notifier,
                 pager: Notifier, audit: AuditSink, *, mode: Mode | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.mode = mode or policy.mode
        self.state = state
        self.actuator = actuator
        self.owner = owner
        self.pager = pager
        self.audit = audit
        self.clock = clock
        self._lock = threading.Lock()  # one decision at a time: guardrail counts stay true

    def handle(self, alerts: list[Alert]) -> list[Decision]:
        out: list[Decision] = []
        for alert in alerts:
            if alert.status != "firing":
                continue  # a resolved alert asks for nothing
            with self._lock:
                out.extend(self._alert(alert))
        return out

    def _alert(self, alert: Alert) -> list[Decision]:
        kinds, approval = self.policy.actions_for(alert)
        if not kinds:
            return [self._decide(self._action(ActionKind.NONE, alert), Outcome.SKIPPED, "no_rule")]
        if alert.alert_class is AlertClass.USER:
            return [self._notify_owner(self._action(ActionKind.NOTIFY, alert))]
        actions = [self._action(k, alert) for k in kinds]
        fresh = [a for a in actions if not self._seen(a)]
        decisions = [self._decide(a, Outcome.DUPLICATE, "already_handled") for a in actions if a not in fresh]
        if not fresh:
            return decisions
        verdict = self._judge(alert, fresh)
        if verdict.skip:
            return decisions + self._refuse(alert, fresh, verdict)
        for action in fresh:
            decisions.append(self._carry_out(action, approval))
        if self.mode is Mode.EXECUTE and any(d.outcome is Outcome.ACTED for d in decisions):
            self.state.record(self.clock(), guards.REMEDIATION, alert.host, alert.job_id)
        return decisions

    def _action(self, kind: ActionKind, alert: Alert) -> Action:
        target = alert.host if kind is ActionKind.DRAIN else f"{alert.job_id}@{alert.host}"
        reason = f"stepwatch: {alert.name} cause {alert.cause or 'unknown'} job {alert.job_id or '-'}"
        return Action(action_id(kind, alert, target), kind, alert.host, alert.job_id,
                      reason.replace("=", " ")[:_MAX_REASON], alert)

    def _seen(self, action: Action) -> bool:
        row = self.state.action(action.id)
        return row is not None and row.status in _FINAL

    def _judge(self, alert: Alert, actions: list[Action]) -> guards.Verdict:
        if not alert.host:
            return guards.Verdict("no_host")
        try:
            node = self.actuator.node_state(alert.host)
        except ActuatorError as err:
            return guards.Verdict("node_state_unknown", detail=str(err))
        drains = any(a.kind is ActionKind.DRAIN for a in actions)
        return guards.judge(self.state, self.policy.guardrails, alert, node, drains=drains,
                            cluster_nodes=self._cluster_nodes(), now=self.clock())

    def _cluster_nodes(self) -> int:
        if self.policy.cluster_nodes:
            return self.policy.cluster_nodes
        try:
            return self.actuator.node_count()
        except ActuatorError:
            return 0  # unknown size: the cap is one node

    def _refuse(self, alert: Alert, actions: list[Action], verdict: guards.Verdict) -> list[Decision]:
        if verdict.trip:
            self.state.set_breaker(True, self.clock(), verdict.detail)
            self.audit.breaker(True)
            log.error("circuit breaker opened detail=%s", verdict.detail)
        if verdict.escalate:
            self._page(alert, verdict.skip or "", verdict.detail)
        outcome = Outcome.ESCALATED if verdict.escalate else Outcome.SKIPPED
        return [self._decide(a, outcome, verdict.skip or "", verdict.detail) for a in actions]

    def _carry_out(self, action: Action, approval: bool) -> Decision:
        if self.mode is Mode.OBSERVE:
            self._store(action, Status.DRY_RUN, 0, "dry_run")
            return self._decide(action, Outcome.DRY_RUN, "observe_mode")
        needs = approval or action.kind in self.policy.guardrails.approval_actions
        if self.mode is Mode.RECOMMEND or needs:
            self._store(action, Status.QUEUED, 0, "awaiting_approval")
            return self._decide(action, Outcome.QUEUED, "recommend_mode" if not needs else "needs_approval")
        return self.execute(action)

    def execute(self, action: Action) -> Decision:
        """Run the action through the actuator now (execute mode or a person's approval)."""
        now = self.clock()
        prior = self.state.action(action.id)
        attempts = (prior.attempts if prior else 0) + 1
        self.state.record(now, guards.ATTEMPT, action.node, action.job_id)
        start = time.monotonic()
        try:
            detail = self._act(action)
        except ActuatorError as err:
            status = Status.FAILED_TRANSIENT if err.transient else Status.FAILED_PERMANENT
            self.audit.actuator_error(self.actuator.name, err.transient)
            self._store(action, status, attempts, str(err))
            log.warning("action failed id=%s transient=%s error=%s", action.id, err.transient, err)
            return self._decide(action, Outcome.FAILED, status, str(err))
        if action.kind is ActionKind.DRAIN:
            self.state.record(self.clock(), guards.DRAIN, action.node, action.job_id)
        self._store(action, Status.DONE, attempts, detail)
        took = time.monotonic() - start
        log.info("action done id=%s seconds=%.3f detail=%s", action.id, took, detail)
        return self._decide(action, Outcome.ACTED, "executed", f"{detail} ({took:.3f} s)")

    def _act(self, action: Action) -> str:
        if action.kind is ActionKind.DRAIN:
            return self.actuator.drain(action.node, action.reason)
        if action.kind is ActionKind.REQUEUE:
            if not action.job_id:
                raise ActuatorError("the alert names no job_id to requeue", transient=False)
            return self.actuator.requeue(action.job_id, action.node)
        self.owner.send(self._event("notify", action.alert, action.reason))
        return "owner notified"

    def _notify_owner(self, action: Action) -> Decision:
        if self._seen(action):
            return self._decide(action, Outcome.DUPLICATE, "already_handled")
        if self.mode is Mode.OBSERVE:
            self._store(action, Status.DRY_RUN, 0, "dry_run")
            return self._decide(action, Outcome.DRY_RUN, "observe_mode")
        return self.execute(action)  # telling a user of their error needs no approval

    def _page(self, alert: Alert, reason: str, detail: str) -> None:
        try:
            self.pager.send(self._event("page", alert, f"{reason}: {detail}"))
        except ActuatorError as err:
            self.audit.actuator_error("pager", err.transient)
            log.error("page failed reason=%s error=%s", reason, err)

    def _owner(self, alert: Alert) -> str:
        owner = alert.labels.get("owner") or alert.labels.get("user", "")
        if owner or not alert.job_id:
            return owner
        try:
            return self.actuator.job_owner(alert.job_id)
        except ActuatorError as err:
            log.warning("job owner unknown job_id=%s error=%s", alert.job_id, err)
            return ""

    def _event(self, kind: str, alert: Alert, text: str) -> dict[str, object]:
        return {"kind": kind, "to": "on-call" if kind == "page" else self._owner(alert),
                "alertname": alert.name, "job_id": alert.job_id, "host": alert.host,
                "cause": alert.cause, "summary": alert.summary(), "text": text,
                "description": alert.annotations.get("description", "")}

    def _store(self, action: Action, status: str, attempts: int, detail: str) -> None:
        now = self.clock()
        prior = self.state.action(action.id)
        a = action.alert
        self.state.put_action(ActionRow(
            action.id, action.kind.value, action.node, action.job_id, a.name, a.fingerprint, status,
            attempts, prior.created if prior else now, now, action.reason, detail,
            json.dumps({"fingerprint": a.fingerprint, "labels": a.labels, "annotations": a.annotations})))

    def _decide(self, action: Action, outcome: Outcome, reason: str, detail: str = "") -> Decision:
        a = action.alert
        decision = Decision(self.clock(), action.id, action.kind, outcome, self.mode, reason,
                            action.node, action.job_id, a.name, a.fingerprint, a.cause,
                            a.alert_class.value, detail)
        log.info("decision id=%s action=%s outcome=%s reason=%s node=%s job_id=%s", action.id,
                 action.kind.value, outcome.value, reason, action.node, action.job_id)
        self.audit.record(decision)
        return decision

    def approve(self, action_id_: str) -> Decision | None:
        """Run a queued action (a person approved it). None when no such queued action."""
        with self._lock:
            row = self.state.action(action_id_)
            if row is None or row.status != Status.QUEUED:
                return None
            data = json.loads(row.alert or "{}")
            alert = Alert(data.get("fingerprint", row.fingerprint), "firing", data.get("labels", {}),
                          data.get("annotations", {}))
            action = replace(self._action(ActionKind(row.kind), alert), id=row.id)
            decision = self.execute(action)
            if decision.outcome is Outcome.ACTED and action.kind is not ActionKind.NOTIFY:
                self.state.record(self.clock(), guards.REMEDIATION, action.node, action.job_id)
            return decision

    def close_breaker(self, who: str) -> bool:
        with self._lock:
            was = self.state.breaker().open
            self.state.set_breaker(False, self.clock(), f"closed by {who}")
            self.audit.breaker(False)
            return was

    def node_state(self, node: str) -> NodeState:
        return self.actuator.node_state(node)
