"""The remediator's vocabulary: modes, actions, outcomes, alerts and decisions."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum


class Mode(StrEnum):
    """How far the remediator goes: dry-run, queue for a person, or act."""

    OBSERVE = "observe"  # decide and record only (the default)
    RECOMMEND = "recommend"  # queue every action for approval
    EXECUTE = "execute"  # act, except actions the policy says need approval


class ActionKind(StrEnum):
    DRAIN = "drain"  # take the node out of the scheduler
    REQUEUE = "requeue"  # requeue the job from its last checkpoint, excluding the node
    NOTIFY = "notify"  # tell the job's owner
    ESCALATE = "escalate"  # page a person instead of acting
    NONE = "none"  # no rule matched: recorded, nothing done


class Outcome(StrEnum):
    """What became of one decision (the ``outcome`` label of the decisions metric)."""

    ACTED = "acted"
    DRY_RUN = "dry_run"
    QUEUED = "queued"  # waiting for approval
    SKIPPED = "skipped"  # a guardrail or the policy said no; ``reason`` says which
    DUPLICATE = "duplicate"  # this action was already done for this alert
    FAILED = "failed"
    ESCALATED = "escalated"
    RECOVERED = "recovered"  # the alert resolved within the deadline after the action
    NOT_RECOVERED = "not_recovered"  # still firing at the deadline: a person is paged


class AlertClass(StrEnum):
    SYSTEM = "system"
    USER = "user"


@dataclass(frozen=True)
class Alert:
    """One alert of an Alertmanager webhook (payload version 4)."""

    fingerprint: str
    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    starts_at: str = ""

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def host(self) -> str:
        return self.labels.get("host", "")

    @property
    def job_id(self) -> str:
        return self.labels.get("job_id", "")

    @property
    def cause(self) -> str:
        return self.labels.get("cause", "")

    @property
    def alert_class(self) -> AlertClass:
        return AlertClass.USER if self.labels.get("class") == "user" else AlertClass.SYSTEM

    def summary(self) -> str:
        return self.annotations.get("summary") or self.name


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_TARGET_MAX = 80


def alert_key(alert: Alert) -> str:
    """One firing of one alert as a short stable key: one remediation per key.

    Name and fingerprint, and what the action would touch (host, job), and when this
    firing began (``startsAt``: the same in every repeat of one firing, new when the
    alert fires again). Before, name and fingerprint alone: the sender chooses the
    fingerprint, so one shared by alerts for many hosts counted as one remediation in the
    rate limit (12 nodes drained at a limit of 3/h); and a GPU's fatal XID has the same
    labels, so the same fingerprint, every time, so its second firing, after the node was
    repaired, was "already handled" and never drained."""
    text = f"{alert.name}|{alert.fingerprint}|{alert.host}|{alert.job_id}|{alert.starts_at}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def labels_key(alert: Alert) -> str:
    """The alert's exact labels as a short stable key: two alerts that share a fingerprint
    (the sender chooses it) but not their labels get different keys."""
    text = json.dumps(sorted(alert.labels.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def action_id(kind: ActionKind, alert: Alert, target: str) -> str:
    """A stable id from action + target + alert: a retried webhook finds the earlier action.

    A target too long for the id keeps its head and a digest of the whole: two targets
    that differ only past the cut (a long job id, then the host) get different ids."""
    safe = _SAFE.sub("_", target) or "none"
    if len(safe) > _TARGET_MAX:
        digest = hashlib.sha256(target.encode()).hexdigest()[:8]
        safe = f"{safe[: _TARGET_MAX - 9]}.{digest}"
    return f"{kind.value}-{safe}-{_SAFE.sub('_', alert.name)[:64]}-{alert_key(alert)}"


@dataclass(frozen=True)
class Action:
    """One planned action for one alert."""

    id: str
    kind: ActionKind
    node: str
    job_id: str
    reason: str
    alert: Alert

    def describe(self) -> str:
        target = self.node if self.kind is ActionKind.DRAIN else (self.job_id or self.node)
        return f"{self.kind.value} {target}"


@dataclass(frozen=True)
class Decision:
    """What the remediator decided about one action, and why. One audit record."""

    ts: float
    action_id: str
    action: ActionKind
    outcome: Outcome
    mode: Mode
    reason: str
    node: str
    job_id: str
    alertname: str
    fingerprint: str
    cause: str
    alert_class: str
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "ts": self.ts,
            "id": self.action_id,
            "action": self.action.value,
            "outcome": self.outcome.value,
            "mode": self.mode.value,
            "reason": self.reason,
            "host": self.node,
            "job_id": self.job_id,
            "alertname": self.alertname,
            "fingerprint": self.fingerprint,
            "cause": self.cause,
            "class": self.alert_class,
            "detail": self.detail,
        }
