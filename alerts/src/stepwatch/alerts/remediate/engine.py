"""Decide and act: one alert in, one audited decision per planned action out.

Order for each alert of a webhook (cheap before costly; docs/remediation.md):
collapse repeats within the webhook; resolved alerts only settle outcomes;
policy rule; duplicate (done, queued or recently skipped); the per-webhook
cap; identity (one plain node name, one plain job id); user alerts go to the
owner under their own limits; guardrails needing no scheduler call; then the
scheduler: the node's state, the job's nodes, the breaker's node count.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from stepwatch.alerts.remediate import guards, identity
from stepwatch.alerts.remediate.actuators.base import Actuator, NodeState, Notifier
from stepwatch.alerts.remediate.audit import AuditSink
from stepwatch.alerts.remediate.confirm import (
    Confirmations,
    FiringNow,
    Series,
    decision_labels,
    differing,
)
from stepwatch.alerts.remediate.lookups import Lookups
from stepwatch.alerts.remediate.model import (
    Action,
    ActionKind,
    Alert,
    AlertClass,
    Decision,
    Mode,
    Outcome,
    action_id,
    alert_key,
    labels_key,
)
from stepwatch.alerts.remediate.notices import Notices
from stepwatch.alerts.remediate.outcome import OutcomeTracker
from stepwatch.alerts.remediate.policy import Policy
from stepwatch.alerts.remediate.state import RESERVE, RESERVE_DRAIN, ActionRow, State, Status
from stepwatch.errors import ActuatorError, RemediationError

log = logging.getLogger(__name__)

_FINAL = {Status.DONE, Status.QUEUED, Status.DRY_RUN, Status.FAILED_PERMANENT, Status.REJECTED}
_MAX_REASON = 200
PRUNE_EVERY_S = 60.0
_JOBLESS_DRAIN = (
    "a drain without the job_id label is allowed only for a policy rule with scope: node "
    "(and guardrails.job_check.jobless_drain: true)"
)
# skips reached through a scheduler call, or about the alert itself: remembered for a while so a
# retried webhook is a duplicate, not the same scheduler calls again (escalations too: one page);
# not when they may pass by themselves (a scheduler that did not answer, a pending job)
_REMEMBER = {
    "invalid_identity",
    "no_host",
    "no_job",
    "node_state_unknown",
    "unknown_node",
    "drained_by_person",
    "job_unknown",
    "job_unverifiable",
    "node_not_in_job",
}

# an approval refused for one of these (the scheduler or Prometheus did not answer) leaves
# the action queued, to be approved again; any other refusal ends it (a job that runs on no
# node, pending or finished, included: deferred, a finished job's action stayed queued for
# good, with no way to clear it)
_NO_ANSWER = {"firing_unconfirmed", "node_state_unknown", "job_unknown"}


def _memory_id(action: Action) -> str:
    """Where a skip for the alert's input is remembered: the action id and the digest of the
    alert's exact labels. An alert refused for what it said (a forged one reusing a real
    alert's fingerprint) so never makes the real alert's action a duplicate."""
    return f"{action.id}.{labels_key(action.alert)}"


def _stored_alert(row: ActionRow) -> Alert:
    """The alert an action row was decided on, as it came (labels, annotations and
    ``startsAt``: without it the key changed, so a sibling action's reservation read as
    another alert's and the outcome watch waited under a key no ``resolved`` matched)."""
    data = json.loads(row.alert or "{}")
    labels = dict(data.get("labels", {})) or {"host": row.node, "job_id": row.job_id}
    return Alert(
        str(data.get("fingerprint", row.fingerprint)),
        "firing",
        labels,
        dict(data.get("annotations", {})),
        str(data.get("starts_at", "")),
    )


class RemediatorStopping(RemediationError):
    """The remediator is stopping: a webhook or approval not yet decided is refused."""


def _noted(note: str, detail: str) -> str:
    """A detail led by who asked for it (an approval), when someone did."""
    return f"{note}: {detail}" if note and detail else note or detail


class Remediator:
    def __init__(
        self,
        policy: Policy,
        state: State,
        actuator: Actuator,
        owner: Notifier,
        pager: Notifier,
        audit: AuditSink,
        *,
        mode: Mode | None = None,
        clock: Callable[[], float] = time.time,
        outcomes: OutcomeTracker | None = None,
    ) -> None:
        self.policy = policy
        self.mode = mode or policy.mode
        self.state = state
        self.actuator = actuator
        self.owner = owner
        self.pager = pager
        self.audit = audit
        self.clock = clock
        self.outcomes = outcomes
        self.scheme = identity.scheme_of(actuator.name)
        self.notices = Notices(state, policy.guardrails, owner, actuator, clock)
        # what Prometheus fires (None: the policy does not ask), and the labels compared
        self.firing: Callable[[Alert], Series | None] | None = (
            FiringNow(policy.outcome.prometheus_url) if policy.confirms_firing else None
        )
        self.decision_labels = decision_labels(policy)
        self._lock = threading.Lock()  # one decision at a time: guardrail counts stay true
        self.stopping = threading.Event()  # set: nothing more is decided (see the server's stop)
        self._pruned = float("-inf")

    def handle(self, alerts: list[Alert]) -> list[Decision]:
        self._prune()
        out: list[Decision] = []
        seen: set[tuple[str, str, str]] = set()
        lookups = self._lookups()
        budget = [self.policy.guardrails.max_alerts_per_webhook]
        for alert in map(self._canonical, alerts):
            key = (alert.fingerprint, alert.name, alert.status)
            if key in seen:
                continue  # the same alert twice in one webhook: once is enough
            seen.add(key)
            if alert.status != "firing":
                if self.outcomes is not None:
                    out.extend(self.outcomes.resolved(alert))
                continue  # a resolved alert asks for nothing more
            if self.outcomes is not None:
                self.outcomes.refired(alert)
            with self._lock:
                if self.stopping.is_set():  # waited for the lock while the service stopped
                    raise RemediatorStopping("the remediator is stopping")
                out.extend(self._alert(alert, lookups, budget))
        if len(seen) < len(alerts):
            log.info("webhook repeats collapsed alerts=%d distinct=%d", len(alerts), len(seen))
        return out

    def _lookups(self) -> Lookups:
        """Answers kept for one webhook or approval: the scheduler's and Prometheus's."""
        firing = Confirmations(self.firing) if self.firing is not None else None
        return Lookups(self.actuator, self.policy.cluster_nodes, firing)

    def _canonical(self, alert: Alert) -> Alert:
        job = identity.canonical_job(alert.job_id, self.scheme)
        if job == alert.job_id:
            return alert
        return replace(alert, labels={**alert.labels, "job_id": job})

    def _prune(self) -> None:
        """At most once a minute, drop state rows no guardrail or duplicate check reads."""
        now = self.clock()
        if now - self._pruned < PRUNE_EVERY_S:
            return
        self._pruned = now
        g = self.policy.guardrails
        try:
            with self._lock:
                actions, history = self.state.prune(now - g.skip_memory_s, now - g.history_span_s)
        except Exception:  # housekeeping: never in the way of a decision (tried next minute)
            log.exception("state prune failed")
            return
        if actions or history:
            log.info("state pruned skipped_actions=%d history_rows=%d", actions, history)

    def _alert(self, alert: Alert, lookups: Lookups, budget: list[int]) -> list[Decision]:
        kinds, approval = self.policy.actions_for(alert)
        if not kinds:
            return [self._decide(self._action(ActionKind.NONE, alert), Outcome.SKIPPED, "no_rule")]
        if alert.alert_class is AlertClass.USER:
            kinds = (ActionKind.NOTIFY,)
        actions = [self._action(k, alert) for k in kinds]
        fresh = [a for a in actions if not self._seen(a)]
        decisions = [
            self._decide(a, Outcome.DUPLICATE, "already_handled") for a in actions if a not in fresh
        ]
        if not fresh:
            return decisions
        if budget[0] <= 0:
            return decisions + [self._decide(a, Outcome.SKIPPED, "webhook_cap") for a in fresh]
        budget[0] -= 1
        problem = identity.problem(alert.host, alert.job_id, self.scheme)
        if problem:
            return decisions + self._refuse(
                alert, fresh, guards.Verdict("invalid_identity", detail=problem)
            )
        if alert.alert_class is AlertClass.USER:
            return decisions + [self._notify_owner(a, lookups) for a in fresh]
        # a system rule's notify tells the owner too (before, it went to the scheduler,
        # failed for good and spent one of the node's attempts)
        decisions += [self._notify_owner(a, lookups) for a in fresh if a.kind is ActionKind.NOTIFY]
        scheduler = [a for a in fresh if a.kind is not ActionKind.NOTIFY]
        return decisions + (
            self._remediate(alert, scheduler, approval, lookups) if scheduler else []
        )

    def _remediate(
        self, alert: Alert, actions: list[Action], approval: bool, lookups: Lookups
    ) -> list[Decision]:
        """A system alert's fresh actions: the job rule, the guardrails, then act or queue."""
        judged = [(a, self._no_job(alert, a)) for a in actions]
        decisions = [d for a, v in judged if v.skip for d in self._refuse(alert, [a], v)]
        actions = [a for a, v in judged if not v.skip]
        if not actions:
            return decisions
        verdict = self._judge(alert, actions, lookups)
        if verdict.skip:
            return decisions + self._refuse(alert, actions, verdict)
        decisions += [self._carry_out(action, approval) for action in actions]
        self._acted(alert, [d for d in decisions if d.outcome is Outcome.ACTED])
        return decisions

    def _no_job(self, alert: Alert, action: Action) -> guards.Verdict:
        """An action without the alert's job_id: a requeue never; a drain only for a rule
        declared ``scope: node`` (the same answer at queue time and at approval)."""
        if alert.job_id:
            return guards.GO
        if action.kind is ActionKind.REQUEUE:
            return guards.Verdict("no_job", detail="a requeue needs the job_id label")
        if action.kind is not ActionKind.DRAIN or self.policy.jobless_drain(alert):
            return guards.GO
        return guards.Verdict("no_job", detail=_JOBLESS_DRAIN)

    def _action(self, kind: ActionKind, alert: Alert) -> Action:
        host = alert.host if identity.node_ok(alert.host) else identity.word(alert.host)
        job = (
            alert.job_id
            if identity.job_ok(alert.job_id, self.scheme)
            else identity.word(alert.job_id)
        )
        target = f"{job}@{host}" if job or kind is not ActionKind.DRAIN else host
        reason = (
            f"stepwatch: {identity.word(alert.name)} "
            f"cause {identity.word(alert.cause) or 'unknown'} "
            f"job {job or '-'}"
        )
        return Action(action_id(kind, alert, target), kind, host, job, reason[:_MAX_REASON], alert)

    def _seen(self, action: Action) -> bool:
        """Done, queued or refused for good; or skipped lately, for this very input."""
        row = self.state.action(action.id)
        if row is not None and row.status == Status.DRY_RUN:
            return self.mode is Mode.OBSERVE  # observe mode never blocks a later execute mode
        if row is not None and row.status != Status.SKIPPED:
            return row.status in _FINAL
        return self._recent(row) or self._recent(self.state.action(_memory_id(action)))

    def _recent(self, row: ActionRow | None) -> bool:
        """A skip remembered within ``webhook.skip_memory``."""
        return (
            row is not None
            and row.status == Status.SKIPPED
            and self.clock() - row.updated < self.policy.guardrails.skip_memory_s
        )

    def _judge(
        self, alert: Alert, actions: list[Action], lookups: Lookups, exclude_ref: str | None = None
    ) -> guards.Verdict:
        g, now, host = self.policy.guardrails, self.clock(), alert.host
        if not host:
            return guards.Verdict("no_host")
        # first: an alert Prometheus does not fire is nobody's (before the guardrails, a
        # forged one for a repeat offender still paged the on-call)
        verdict = self._confirmed(alert, lookups)
        if verdict.skip:
            return verdict
        verdict = guards.precheck(self.state, g, alert, now=now, exclude_ref=exclude_ref)
        if verdict.skip:
            return verdict
        try:
            node = lookups.node_state(host)
        except ActuatorError as err:
            return guards.Verdict(
                "node_state_unknown", detail=str(err)[:300], transient=err.transient
            )
        verdict = guards.node_checks(node)
        if verdict.skip or not alert.job_id:
            return (
                verdict
                if verdict.skip
                else self._breaker(actions, host, node, lookups, exclude_ref)
            )
        try:
            nodes = lookups.job_nodes(alert.job_id)
        except ActuatorError as err:
            return guards.Verdict("job_unknown", detail=str(err)[:300], transient=err.transient)
        verdict = guards.job_check(g, host, alert.job_id, nodes)
        return verdict if verdict.skip else self._breaker(actions, host, node, lookups, exclude_ref)

    def _confirmed(self, alert: Alert, lookups: Lookups) -> guards.Verdict:
        """Prometheus fires this alert for this node and job now, with the webhook's values
        of every label a decision reads (when the policy asks). Neither skip is
        remembered: a later repeat of the alert is judged afresh."""
        if lookups.confirmations is None:
            return guards.GO
        series = lookups.confirmations.series(alert)
        if series is None:
            return guards.Verdict(
                "firing_unconfirmed", detail="Prometheus did not answer", transient=True
            )
        if not series:
            return guards.Verdict(
                "not_firing",
                detail="Prometheus fires no alert of this name for this host and job",
                transient=True,
            )
        diff = differing(alert, series, self.decision_labels)
        if diff:
            return guards.Verdict(
                "not_firing",
                detail="Prometheus fires it with other labels: " + ", ".join(diff[:8]),
                transient=True,
            )
        return guards.GO

    def _breaker(
        self,
        actions: list[Action],
        host: str,
        node: NodeState,
        lookups: Lookups,
        exclude_ref: str | None,
    ) -> guards.Verdict:
        if not any(a.kind is ActionKind.DRAIN for a in actions):
            return guards.GO
        return guards.breaker_check(
            self.state,
            self.policy.guardrails,
            host,
            node,
            cluster_nodes=lookups.cluster_nodes(),
            now=self.clock(),
            exclude_ref=exclude_ref,
        )

    def _refuse(
        self,
        alert: Alert,
        actions: list[Action],
        verdict: guards.Verdict,
        status: str = Status.SKIPPED,
        note: str = "",
    ) -> list[Decision]:
        if verdict.trip:
            self.state.set_breaker(True, self.clock(), verdict.detail)
            self.audit.breaker(True)
            log.error("circuit breaker opened detail=%s", verdict.detail)
        if verdict.escalate:
            self._page(alert, verdict.skip or "", verdict.detail)
        outcome = Outcome.ESCALATED if verdict.escalate else Outcome.SKIPPED
        reason = verdict.skip or ""
        detail = _noted(note, f"{reason}: {verdict.detail}" if verdict.detail else reason)
        for a in actions:
            if status != Status.SKIPPED or verdict.escalate:
                self._store(a, status, 0, detail)  # final, or one page per action
            elif reason in _REMEMBER and not verdict.transient:
                self._store(a, status, 0, detail, row_id=_memory_id(a))  # this input only
        return [self._decide(a, outcome, reason, _noted(note, verdict.detail)) for a in actions]

    def _carry_out(self, action: Action, approval: bool) -> Decision:
        if self.mode is Mode.OBSERVE:
            self._store(action, Status.DRY_RUN, 0, "dry_run")
            return self._decide(action, Outcome.DRY_RUN, "observe_mode")
        needs = approval or action.kind in self.policy.guardrails.approval_actions
        if self.mode is Mode.RECOMMEND or needs:
            self._store(action, Status.QUEUED, 0, "awaiting_approval")
            self._reserve(action)
            return self._decide(
                action, Outcome.QUEUED, "recommend_mode" if not needs else "needs_approval"
            )
        return self.execute(action)

    def _reserve(self, action: Action) -> None:
        """A queued action holds its place in the rate limit, cooldowns and breaker count."""
        now, ref = self.clock(), alert_key(action.alert)
        self.state.record(now, RESERVE, action.node, action.job_id, ref, action.id)
        if action.kind is ActionKind.DRAIN:
            self.state.record(now, RESERVE_DRAIN, action.node, action.job_id, ref, action.id)

    def _acted(self, alert: Alert, acted: list[Decision]) -> None:
        if not acted:
            return
        ref = alert_key(alert)
        if not self.state.count(guards.REMEDIATION, 0.0, ref=ref):
            self.state.record(self.clock(), guards.REMEDIATION, alert.host, alert.job_id, ref)
        if self.outcomes is not None:
            for d in acted:
                self.outcomes.acted(alert, d.action)

    def execute(self, action: Action, note: str = "") -> Decision:
        """Run the action through the actuator now (execute mode or a person's approval,
        ``note`` then names the person in the detail)."""
        now = self.clock()
        prior = self.state.action(action.id)
        attempts = (prior.attempts if prior else 0) + 1
        self.state.record(now, guards.ATTEMPT, action.node, action.job_id)
        self._store(action, Status.STARTED, attempts, _noted(note, "started"))
        start = time.monotonic()
        try:
            detail = self._act(action)
        except ActuatorError as err:
            status = Status.FAILED_TRANSIENT if err.transient else Status.FAILED_PERMANENT
            self.audit.actuator_error(self.actuator.name, err.transient)
            self._store(action, status, attempts, _noted(note, str(err)))
            log.warning("action failed id=%s transient=%s error=%s", action.id, err.transient, err)
            return self._decide(action, Outcome.FAILED, status, _noted(note, str(err)))
        if action.kind is ActionKind.DRAIN:
            self.state.record(
                self.clock(),
                guards.DRAIN,
                action.node,
                action.job_id,
                alert_key(action.alert),
                action.id,
            )
        self._store(action, Status.DONE, attempts, _noted(note, detail))
        took = time.monotonic() - start
        log.info("action done id=%s seconds=%.3f detail=%s", action.id, took, detail)
        return self._decide(
            action, Outcome.ACTED, "executed", _noted(note, f"{detail} ({took:.3f} s)")
        )

    def recover_interrupted(self) -> list[Decision]:
        """Actions a stopped remediator left half done (their row still ``started``):
        each is recorded failed, and a requeue cut off after ``requeuehold`` has its job
        released by the actuator (``release_interrupted``, when it has one). Before, such
        a job stayed held for good: a repeat of the alert found it not running and did
        nothing, and no record said why."""
        out: list[Decision] = []
        with self._lock:
            for row in self.state.actions(Status.STARTED, limit=10_000):
                alert = _stored_alert(row)  # its name too (it was "" in the list and audit)
                action = Action(
                    row.id, ActionKind(row.kind), row.node, row.job_id, row.reason, alert
                )
                detail = "interrupted (the remediator stopped while acting)"
                if action.kind is ActionKind.DRAIN:
                    # the scheduler may have drained it (scontrol outlives a kill -9): counted
                    # as a drain, so the breaker and the cooldowns hold (before, three drains
                    # sat in a window capped at two)
                    ref = alert_key(alert)
                    self.state.record(self.clock(), guards.DRAIN, row.node, row.job_id, ref, row.id)
                    if not self.state.count(guards.REMEDIATION, 0.0, ref=ref):
                        self.state.record(
                            self.clock(), guards.REMEDIATION, row.node, row.job_id, ref
                        )
                    detail += "; counted as a drain (the node may be drained)"
                release = getattr(self.actuator, "release_interrupted", None)
                if action.kind is ActionKind.REQUEUE and release is not None:
                    try:
                        detail += f"; {release(row.job_id, row.node)}"
                    except ActuatorError as err:
                        detail += f"; the job may be left held: {err}"
                log.error("action interrupted id=%s detail=%s", row.id, detail)
                self._store(action, Status.FAILED_PERMANENT, row.attempts, detail, row.id)
                out.append(self._decide(action, Outcome.FAILED, "interrupted", detail))
        return out

    def _act(self, action: Action) -> str:
        if action.kind is ActionKind.DRAIN:
            return self.actuator.drain(action.node, action.reason)
        if action.kind is ActionKind.REQUEUE:
            if not action.job_id:
                raise ActuatorError("the alert names no job_id to requeue", transient=False)
            return self.actuator.requeue(action.job_id, action.node)
        raise ActuatorError(f"{action.kind.value} is not a scheduler action", transient=False)

    def _notify_owner(self, action: Action, lookups: Lookups) -> Decision:
        skip, owner = self.notices.check(action.alert, lookups)
        if skip:
            return self._decide(action, Outcome.SKIPPED, skip)
        if self.mode is Mode.OBSERVE:
            self._store(action, Status.DRY_RUN, 0, "dry_run")
            return self._decide(action, Outcome.DRY_RUN, "observe_mode")
        try:  # telling a user of their error needs no approval
            detail = self.notices.send(action.alert, action.reason, owner)
        except ActuatorError as err:
            self.audit.actuator_error("notify", err.transient)
            self._store(
                action,
                Status.FAILED_TRANSIENT if err.transient else Status.FAILED_PERMANENT,
                1,
                str(err),
            )
            return self._decide(action, Outcome.FAILED, "notify_failed", str(err))
        self._store(action, Status.DONE, 1, detail)
        return self._decide(action, Outcome.ACTED, "executed", detail)

    def _page(self, alert: Alert, reason: str, detail: str) -> None:
        limited = self.notices.page_limit(alert, reason)
        if limited is not None:  # the decision is recorded (escalated); the page is not repeated
            log.info(
                "page not sent reason=%s limit=%s node=%s job_id=%s",
                reason,
                limited,
                alert.host,
                alert.job_id,
            )
            return
        try:
            self.pager.send(self.notices.event("page", alert, f"{reason}: {detail}", "on-call"))
            self.notices.paged(alert, reason)
        except ActuatorError as err:
            self.audit.actuator_error("pager", err.transient)
            log.error("page failed reason=%s error=%s", reason, err)

    def _store(
        self, action: Action, status: str, attempts: int, detail: str, row_id: str = ""
    ) -> None:
        now = self.clock()
        prior = self.state.action(row_id or action.id)
        a = action.alert
        self.state.put_action(
            ActionRow(
                row_id or action.id,
                action.kind.value,
                action.node,
                action.job_id,
                identity.word(a.name),
                identity.word(a.fingerprint),
                status,
                attempts,
                prior.created if prior else now,
                now,
                action.reason,
                detail[:500],
                json.dumps(
                    {
                        "fingerprint": a.fingerprint,
                        "labels": a.labels,
                        "annotations": a.annotations,
                        "starts_at": a.starts_at,  # part of the alert's key (alert_key)
                    }
                )
                if status in (Status.QUEUED, Status.STARTED)  # approval, or recovery
                else "",
            )
        )

    def _decide(self, action: Action, outcome: Outcome, reason: str, detail: str = "") -> Decision:
        a = action.alert
        decision = Decision(
            self.clock(),
            action.id,
            action.kind,
            outcome,
            self.mode,
            reason,
            action.node,
            action.job_id,
            identity.word(a.name),
            identity.word(a.fingerprint),
            identity.word(a.cause),
            a.alert_class.value,
            detail[:500],
        )
        log.info(
            "decision id=%s action=%s outcome=%s reason=%s node=%s job_id=%s",
            action.id,
            action.kind.value,
            outcome.value,
            reason,
            action.node,
            action.job_id,
        )
        self.audit.record(decision)
        return decision

    def approve(self, action_id_: str, by: str = "") -> Decision | None:
        """Run a queued action (operator ``by`` approved it), after every check again.

        None when no such queued action. The queued row's labels came from the
        webhook: identity, the job rule (a drain without a job only for a
        ``scope: node`` rule), guardrails (without this alert's own reservation),
        the node's state and the job's nodes are all checked again now. The
        decision's detail (audit record and state row) names the operator.
        """
        note = f"approval by {identity.word(by) or 'unknown'}"
        with self._lock:
            if self.stopping.is_set():
                raise RemediatorStopping("the remediator is stopping")
            row = self.state.action(action_id_)
            if row is None or row.status != Status.QUEUED:
                return None
            alert = _stored_alert(row)
            action = replace(self._action(ActionKind(row.kind), alert), id=row.id)
            if self.mode is Mode.OBSERVE:  # a dry run acts for no one: the action stays queued
                return self._decide(action, Outcome.SKIPPED, "observe_mode", note)
            verdict = self._recheck(alert, action)  # its own reservation left out
            if verdict.skip in _NO_ANSWER and verdict.transient:
                # the action stays queued with its reservation, to be approved again. Before,
                # a blip made it rejected for good and the alert's repeats duplicates.
                log.warning("approval deferred id=%s reason=%s by=%s", row.id, verdict.skip, by)
                still = f"{note}; still queued: approve again"
                return self._refuse(alert, [action], verdict, Status.SKIPPED, still)[0]
            self.state.unreserve(row.id)
            if verdict.skip:
                log.warning("approval refused id=%s reason=%s by=%s", row.id, verdict.skip, by)
                return self._refuse(alert, [action], verdict, Status.REJECTED, note)[0]
            log.info("approval id=%s by=%s", row.id, by)
            decision = self.execute(action, note)
            self._acted(alert, [decision] if decision.outcome is Outcome.ACTED else [])
            return decision

    def _recheck(self, alert: Alert, action: Action) -> guards.Verdict:
        problem = identity.problem(alert.host, alert.job_id, self.scheme)
        if problem:
            return guards.Verdict("invalid_identity", detail=problem)
        verdict = self._no_job(alert, action)
        if verdict.skip:
            return verdict
        lookups = self._lookups()
        return self._judge(alert, [action], lookups, exclude_ref=alert_key(alert))

    def close_breaker(self, who: str) -> bool:
        """Close the breaker in operator ``who``'s name (the state's reason and the log)."""
        with self._lock:
            was = self.state.breaker().open
            name = identity.word(who) or "unknown"
            self.state.set_breaker(False, self.clock(), f"closed by {name}")
            self.audit.breaker(False)
            log.warning("circuit breaker closed by=%s was_open=%s", name, was)
            return was

    def node_state(self, node: str) -> NodeState:
        return self.actuator.node_state(node)
