"""Is the alert Prometheus's own? Asked before a drain or requeue (``guardrails.confirm_firing``).

A webhook is its sender's word: anyone with the webhook token, or anyone who can post
to Alertmanager's API (often open inside a cluster), can make up an alert for any node
of any job. With a Prometheus URL the remediator asks Prometheus for the alerts it
fires now of that name for that very node and job (``ALERTS{alertstate="firing"}``)
before it asks the scheduler anything, and goes on only when one of them carries the
webhook's values of every label a decision reads (:func:`decision_labels`: the policy
rules' ``match`` keys, ``class``, the opt-out label). Before, only the name, host and
job were compared: a real notify-only alert (a straggler from a data-loader cause, a
user fault) re-sent with ``class=system, remediation=drain`` drained its node, and a
real alert with its ``stepwatch_opt_out="true"`` label left out went round the opt-out.
Labels nothing decides on may differ: Prometheus adds its ``external_labels`` to what
Alertmanager gets, not to ``ALERTS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from stepwatch.alerts.remediate.model import Alert
from stepwatch.alerts.remediate.outcome import Prometheus, alerts_selector
from stepwatch.alerts.remediate.policy import Policy

Series = list[Mapping[str, str]]


def alerts_query(alert: Alert) -> str:
    """Firing ``ALERTS`` series of the alert's name, host and job (none: the label absent)."""
    return alerts_selector(alert.name, alert.host, alert.job_id)


def decision_labels(policy: Policy) -> frozenset[str]:
    """Every label whose value decides what is done with an alert."""
    keys = {"alertname", "host", "job_id", "class", policy.guardrails.opt_out_label}
    for rule in policy.rules:
        keys.update(rule.match)
    return frozenset(keys)


def differing(alert: Alert, series: Series, keys: frozenset[str]) -> list[str]:
    """The decision labels in which the webhook's alert differs from the closest series
    Prometheus fires ([] when one agrees in all of them)."""
    best: list[str] | None = None
    for labels in series:
        diff = sorted(k for k in keys if labels.get(k, "") != alert.labels.get(k, ""))
        if best is None or len(diff) < len(best):
            best = diff
    return [] if best is None else best


class FiringNow(Prometheus):
    """The label sets of the firing ``ALERTS`` series of the alert's name, host and job;
    None: Prometheus did not answer."""

    def __call__(self, alert: Alert) -> Series | None:
        found = self.series(alerts_query(alert), "alert confirmation")
        if found is None:
            return None
        return [
            {str(k): str(v) for k, v in s.get("metric", {}).items()}
            for s in found
            if isinstance(s, Mapping) and isinstance(s.get("metric"), Mapping)
        ]


class Confirmations:
    """Prometheus's answers within one webhook (or approval): each name, host and job is
    asked once, and once Prometheus did not answer none is asked again (a stalled
    Prometheus costs a webhook one timeout, not one per alert, under the decision lock)."""

    def __init__(self, ask: Callable[[Alert], Series | None]) -> None:
        self.ask = ask
        self._found: dict[tuple[str, str, str], Series] = {}
        self._down = False

    def series(self, alert: Alert) -> Series | None:
        key = (alert.name, alert.host, alert.job_id)
        if key not in self._found:
            if self._down:
                return None
            found = self.ask(alert)
            if found is None:
                # Prometheus down: none asked again; one question it refused: only that one
                is_down = getattr(self.ask, "is_down", None)
                self._down = is_down() if is_down is not None else True
                return None
            self._found[key] = found
        return self._found[key]
