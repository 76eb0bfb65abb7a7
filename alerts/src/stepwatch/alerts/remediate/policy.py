"""The declarative policy: which alerts lead to which actions, and the guardrails.

Loaded once at start and validated; every problem is one line naming the key
(``policy.yaml: rules[2].actions[0]: unknown action 'reboot' (drain, requeue, notify)``).
See ``policy.example.yaml`` for every key with its default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from stepwatch.alerts.remediate.model import ActionKind, Alert, AlertClass, Mode
from stepwatch.errors import ConfigError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)?$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
RULE_ACTIONS = (ActionKind.DRAIN, ActionKind.REQUEUE, ActionKind.NOTIFY)


class PolicyError(ConfigError):
    """The policy file is missing or invalid."""


class Scope(StrEnum):
    """What a rule's alerts are about: a job's rank or port (``job``, the default) or the
    node's own hardware (``node``: XID, ECC, row remap, link down). Only a ``node`` rule
    may drain a node whose alert names no job; the alert's own ``scope`` label is the
    sender's text and decides nothing."""

    JOB = "job"
    NODE = "node"


@dataclass(frozen=True)
class Rule:
    """Alerts whose labels match ``match`` (a value or a list of accepted values) get
    ``actions``."""

    match: Mapping[str, tuple[str, ...]]
    actions: tuple[ActionKind, ...]
    approval: bool = False  # queue these actions for a person even in execute mode
    scope: Scope = Scope.JOB  # node: a drain may go ahead without the alert's job_id

    def matches(self, alert: Alert) -> bool:
        return all(alert.labels.get(k, "") in accepted for k, accepted in self.match.items())


@dataclass(frozen=True)
class Guardrails:
    breaker_max_share: float = 0.10  # of the cluster's nodes drained within the window
    breaker_window_s: float = 3600.0
    node_cooldown_s: float = 3600.0
    job_cooldown_s: float = 900.0
    rate_limit: int = 3  # remediations (one alert's actions) per rate window
    rate_window_s: float = 3600.0
    attempts_per_node: int = 5  # actuator calls on one node per attempt window
    attempt_window_s: float = 86400.0
    repeat_count: int = 3  # remediations of one node in repeat_window_s escalate to a person
    repeat_window_s: float = 7 * 86400.0
    opt_out_nodes: frozenset[str] = frozenset()
    opt_out_label: str = "stepwatch_opt_out"  # an alert label with value "true" opts its node out
    approval_actions: frozenset[ActionKind] = frozenset()
    max_alerts_per_webhook: int = 100  # the rest of a larger webhook is skipped (webhook_cap)
    skip_memory_s: float = 600.0  # a skip is remembered this long: a retry is a duplicate
    jobless_drain: bool = True  # false: no drain without a job_id, even for scope: node rules
    unverified_jobs: str = "allow"  # backends that cannot list a job's nodes: allow | skip
    notify_per_owner: int = 3  # notifications to one owner per notify window
    notify_total: int = 30  # notifications to all owners per notify window
    notify_window_s: float = 3600.0
    # pages for escalations (repeat offender, attempt budget): one per node and reason per
    # window, and so many in all; an alert sender's fresh fingerprints page no more
    page_per_node: int = 1
    page_total: int = 20
    page_window_s: float = 3600.0
    # ask Prometheus (outcome.prometheus_url) whether it fires the alert before a drain or
    # requeue: "auto" (default) when a URL is set, "on" (a URL required) or "off"
    confirm_firing: str = "auto"

    @property
    def history_span_s(self) -> float:
        """How far back any guardrail counts: older history is pruned."""
        return max(
            self.breaker_window_s,
            self.node_cooldown_s,
            self.job_cooldown_s,
            self.rate_window_s,
            self.attempt_window_s,
            self.repeat_window_s,
            self.notify_window_s,
            self.page_window_s,
        )


@dataclass(frozen=True)
class OutcomeSettings:
    """How long an executed remediation has to make its alert resolve, and the evidence."""

    deadline_s: float = 600.0
    check_every_s: float = 15.0
    # set: the job's step time before and after is recorded and judged, and a resolved
    # alert counts only once Prometheus no longer fires it (ALERTS)
    prometheus_url: str = ""
    settle_s: float = 120.0  # the alert must stay resolved this long to count as recovered
    min_gain: float = 0.03  # with both step times known: after <= before * (1 - min_gain)


@dataclass(frozen=True)
class Policy:
    mode: Mode = Mode.OBSERVE
    cluster_nodes: int = 0  # 0: ask the actuator how many nodes the cluster has
    rules: tuple[Rule, ...] = ()
    guardrails: Guardrails = field(default_factory=Guardrails)
    actuator: Mapping[str, Any] = field(default_factory=lambda: {"kind": "slurm"})
    notify: Mapping[str, Any] = field(default_factory=lambda: {"kind": "log"})
    page: Mapping[str, Any] = field(default_factory=lambda: {"kind": "log"})
    audit: Mapping[str, Any] = field(default_factory=dict)
    outcome: OutcomeSettings = field(default_factory=OutcomeSettings)

    @property
    def confirms_firing(self) -> bool:
        """Whether a drain or requeue waits for Prometheus to say the alert fires."""
        mode = self.guardrails.confirm_firing
        return mode == "on" or (mode == "auto" and bool(self.outcome.prometheus_url))

    def rule_for(self, alert: Alert) -> Rule | None:
        """The first rule whose ``match`` the alert's labels satisfy."""
        return next((rule for rule in self.rules if rule.matches(alert)), None)

    def jobless_drain(self, alert: Alert) -> bool:
        """Whether a drain for this alert may go ahead without a job_id: only when the
        matching rule says ``scope: node`` and ``job_check.jobless_drain`` allows it."""
        rule = self.rule_for(alert)
        return (
            self.guardrails.jobless_drain
            and rule is not None
            and rule.scope is Scope.NODE
            and alert.alert_class is AlertClass.SYSTEM
        )

    def actions_for(self, alert: Alert) -> tuple[tuple[ActionKind, ...], bool]:
        """The first matching rule's actions (user-class alerts: notify only) and its
        approval flag."""
        rule = self.rule_for(alert)
        if rule is not None:
            actions = rule.actions
            if alert.alert_class is AlertClass.USER:
                actions = tuple(a for a in actions if a is ActionKind.NOTIFY)
            return actions, rule.approval
        if alert.alert_class is AlertClass.USER:
            return (ActionKind.NOTIFY,), False
        return (), False


def load(path: str | Path) -> Policy:
    import yaml

    name = Path(path).name
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise PolicyError(f"{path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise PolicyError(f"{name}: not valid YAML: {str(err).splitlines()[0]}") from err
    try:
        return from_mapping(raw or {})
    except PolicyError as err:
        raise PolicyError(f"{name}: {err}") from err


def from_mapping(raw: Any) -> Policy:
    data = _mapping("policy", raw)
    _known(
        "policy",
        data,
        {
            "mode",
            "cluster_nodes",
            "rules",
            "guardrails",
            "actuator",
            "notify",
            "page",
            "audit",
            "outcome",
        },
    )
    policy = Policy(
        mode=_enum("mode", Mode, data.get("mode", "observe")),
        cluster_nodes=_int("cluster_nodes", data.get("cluster_nodes", 0), 0),
        rules=tuple(
            _rule(f"rules[{i}]", r) for i, r in enumerate(_list("rules", data.get("rules", [])))
        ),
        guardrails=_guardrails(data.get("guardrails", {})),
        actuator=_plugin(
            "actuator",
            data.get("actuator", {"kind": "slurm"}),
            ("slurm", "kubernetes", "command", "log"),
        ),
        notify=_plugin(
            "notify", data.get("notify", {"kind": "log"}), ("webhook", "command", "log")
        ),
        page=_plugin("page", data.get("page", {"kind": "log"}), ("webhook", "command", "log")),
        audit=_mapping("audit", data.get("audit", {})),
        outcome=_outcome(data.get("outcome", {})),
    )
    if policy.guardrails.confirm_firing == "on" and not policy.outcome.prometheus_url:
        raise PolicyError("guardrails.confirm_firing: true needs outcome.prometheus_url")
    return policy


def _outcome(raw: Any) -> OutcomeSettings:
    data = _mapping("outcome", raw)
    _known("outcome", data, {"deadline", "check_every", "prometheus_url", "settle", "min_gain"})
    d = OutcomeSettings()
    every = _duration("outcome.check_every", data.get("check_every", d.check_every_s))
    if every <= 0:
        raise PolicyError("outcome.check_every: must be more than 0")
    gain = float(data.get("min_gain", d.min_gain))
    if not 0 <= gain < 1:
        raise PolicyError("outcome.min_gain: must be in [0, 1)")
    return OutcomeSettings(
        _duration("outcome.deadline", data.get("deadline", d.deadline_s)),
        every,
        str(data.get("prometheus_url", "") or ""),
        _duration("outcome.settle", data.get("settle", d.settle_s)),
        gain,
    )


def _rule(where: str, raw: Any) -> Rule:
    data = _mapping(where, raw)
    _known(where, data, {"match", "actions", "approval", "scope"})
    match = {
        str(k): _values(f"{where}.match.{k}", v)
        for k, v in _mapping(f"{where}.match", data.get("match", {})).items()
    }
    actions = tuple(
        _action(f"{where}.actions[{i}]", a)
        for i, a in enumerate(_list(f"{where}.actions", data.get("actions")))
    )
    if not actions:
        raise PolicyError(f"{where}.actions: give at least one of drain, requeue, notify")
    if match.get("class") == ("user",) and set(actions) - {ActionKind.NOTIFY}:
        raise PolicyError(f"{where}: class=user alerts are never remediated: notify only")
    scope = _enum(f"{where}.scope", Scope, data.get("scope", Scope.JOB.value))
    return Rule(match, actions, bool(data.get("approval", False)), scope)


def _guardrails(raw: Any) -> Guardrails:
    data = _mapping("guardrails", raw)
    _known(
        "guardrails",
        data,
        {
            "breaker",
            "cooldown",
            "rate_limit",
            "attempts",
            "repeat_offender",
            "opt_out",
            "approval",
            "webhook",
            "job_check",
            "notify",
            "pages",
            "confirm_firing",
        },
    )
    breaker = _mapping("guardrails.breaker", data.get("breaker", {}))
    cooldown = _mapping("guardrails.cooldown", data.get("cooldown", {}))
    rate = _mapping("guardrails.rate_limit", data.get("rate_limit", {}))
    attempts = _mapping("guardrails.attempts", data.get("attempts", {}))
    repeat = _mapping("guardrails.repeat_offender", data.get("repeat_offender", {}))
    opt_out = _mapping("guardrails.opt_out", data.get("opt_out", {}))
    webhook = _mapping("guardrails.webhook", data.get("webhook", {}))
    _known("guardrails.webhook", webhook, {"max_alerts", "skip_memory"})
    job = _mapping("guardrails.job_check", data.get("job_check", {}))
    _known("guardrails.job_check", job, {"jobless_drain", "unverifiable"})
    notify = _mapping("guardrails.notify", data.get("notify", {}))
    _known("guardrails.notify", notify, {"per_owner", "total", "per"})
    pages = _mapping("guardrails.pages", data.get("pages", {}))
    _known("guardrails.pages", pages, {"per_node", "total", "per"})
    d = Guardrails()
    unverifiable = str(job.get("unverifiable", d.unverified_jobs))
    if unverifiable not in ("allow", "skip"):
        raise PolicyError(
            f"guardrails.job_check.unverifiable: {unverifiable!r} is not one of allow, skip"
        )
    share = _number("guardrails.breaker.max_share", breaker.get("max_share", d.breaker_max_share))
    if not 0 < share <= 1:
        raise PolicyError(f"guardrails.breaker.max_share: must be in (0, 1], got {share}")
    return Guardrails(
        breaker_max_share=share,
        breaker_window_s=_duration(
            "guardrails.breaker.window", breaker.get("window", d.breaker_window_s)
        ),
        node_cooldown_s=_duration(
            "guardrails.cooldown.node", cooldown.get("node", d.node_cooldown_s)
        ),
        job_cooldown_s=_duration("guardrails.cooldown.job", cooldown.get("job", d.job_cooldown_s)),
        rate_limit=_int("guardrails.rate_limit.actions", rate.get("actions", d.rate_limit), 1),
        rate_window_s=_duration("guardrails.rate_limit.per", rate.get("per", d.rate_window_s)),
        attempts_per_node=_int(
            "guardrails.attempts.per_node", attempts.get("per_node", d.attempts_per_node), 1
        ),
        attempt_window_s=_duration(
            "guardrails.attempts.window", attempts.get("window", d.attempt_window_s)
        ),
        repeat_count=_int(
            "guardrails.repeat_offender.count", repeat.get("count", d.repeat_count), 1
        ),
        repeat_window_s=_duration(
            "guardrails.repeat_offender.window", repeat.get("window", d.repeat_window_s)
        ),
        opt_out_nodes=frozenset(_values("guardrails.opt_out.nodes", opt_out.get("nodes", []))),
        opt_out_label=str(opt_out.get("label", d.opt_out_label)),
        approval_actions=frozenset(
            _action(f"guardrails.approval[{i}]", a)
            for i, a in enumerate(_list("guardrails.approval", data.get("approval", [])))
        ),
        max_alerts_per_webhook=_int(
            "guardrails.webhook.max_alerts", webhook.get("max_alerts", d.max_alerts_per_webhook), 1
        ),
        skip_memory_s=_duration(
            "guardrails.webhook.skip_memory", webhook.get("skip_memory", d.skip_memory_s)
        ),
        jobless_drain=_bool(
            "guardrails.job_check.jobless_drain", job.get("jobless_drain", d.jobless_drain)
        ),
        unverified_jobs=unverifiable,
        notify_per_owner=_int(
            "guardrails.notify.per_owner", notify.get("per_owner", d.notify_per_owner), 0
        ),
        notify_total=_int("guardrails.notify.total", notify.get("total", d.notify_total), 0),
        notify_window_s=_duration("guardrails.notify.per", notify.get("per", d.notify_window_s)),
        page_per_node=_int("guardrails.pages.per_node", pages.get("per_node", d.page_per_node), 1),
        page_total=_int("guardrails.pages.total", pages.get("total", d.page_total), 1),
        page_window_s=_duration("guardrails.pages.per", pages.get("per", d.page_window_s)),
        confirm_firing=_confirm(data.get("confirm_firing", d.confirm_firing)),
    )


def _confirm(raw: Any) -> str:
    if raw is True or raw is False:
        return "on" if raw else "off"
    if raw == "auto":
        return "auto"
    raise PolicyError(f"guardrails.confirm_firing: {raw!r} is not one of auto, true, false")


def _plugin(where: str, raw: Any, kinds: tuple[str, ...]) -> Mapping[str, Any]:
    data = _mapping(where, raw)
    if data.get("kind") not in kinds:
        raise PolicyError(f"{where}.kind: {data.get('kind')!r} is not one of {', '.join(kinds)}")
    return dict(data)


def _mapping(where: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return raw


def _list(where: str, raw: Any) -> list[Any]:
    if not isinstance(raw, list):
        raise PolicyError(f"{where}: expected a list, got {type(raw).__name__}")
    return raw


def _known(where: str, data: Mapping[str, Any], keys: set[str]) -> None:
    unknown = sorted(set(data) - keys)
    if unknown:
        raise PolicyError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(keys))})"
        )


def _values(where: str, raw: Any) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in items):
        raise PolicyError(f"{where}: expected a string or a list of strings")
    return tuple(str(v) for v in items)


def _action(where: str, raw: Any) -> ActionKind:
    names = ", ".join(a.value for a in RULE_ACTIONS)
    if raw not in {a.value for a in RULE_ACTIONS}:
        raise PolicyError(f"{where}: unknown action {raw!r} ({names})")
    return ActionKind(raw)


def _enum(where: str, enum: Any, raw: Any) -> Any:
    try:
        return enum(raw)
    except ValueError as err:
        names = ", ".join(m.value for m in enum)
        raise PolicyError(f"{where}: {raw!r} is not one of {names}") from err


def _bool(where: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise PolicyError(f"{where}: expected true or false, got {raw!r}")
    return raw


def _number(where: str, raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise PolicyError(f"{where}: expected a number, got {raw!r}")
    return float(raw)


def _int(where: str, raw: Any, low: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < low:
        raise PolicyError(f"{where}: expected an integer >= {low}, got {raw!r}")
    return raw


def _duration(where: str, raw: Any) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw >= 0:
        return float(raw)
    found = _DURATION.match(str(raw).strip())
    if not found:
        raise PolicyError(f"{where}: {raw!r} is not a duration (e.g. 30s, 10m, 1h, 7d)")
    return float(found.group(1)) * _UNIT[found.group(2)]
