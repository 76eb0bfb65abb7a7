"""Is the alert Prometheus's own? Asked before a drain or requeue (``guardrails.confirm_firing``).

A webhook is its sender's word: anyone with the webhook token, or anyone who can post
to Alertmanager's API (often open inside a cluster), can make up an alert for any node
of any job. With a Prometheus URL the remediator asks Prometheus whether it fires an
alert of that name for that very node and job right now (``ALERTS{alertstate="firing"}``)
before it asks the scheduler anything, and refuses otherwise. Prometheus evaluates the
rules over what the workers and agents exported, so a made-up alert gets no node drained.
"""

from __future__ import annotations

from stepwatch.alerts.remediate.model import Alert
from stepwatch.alerts.remediate.outcome import Prometheus, promql_string


def alerts_query(alert: Alert) -> str:
    """Firing ``ALERTS`` series of the alert's name, host and job (none: the label absent)."""
    match = [
        'alertstate="firing"',
        f"alertname={promql_string(alert.name)}",
        f"host={promql_string(alert.host)}",
        f"job_id={promql_string(alert.job_id)}",
    ]
    return "count(ALERTS{" + ",".join(match) + "})"


class FiringNow(Prometheus):
    """True: Prometheus fires the alert now; False: it does not; None: no answer."""

    def __call__(self, alert: Alert) -> bool | None:
        value = self.value(alerts_query(alert), "alert confirmation")
        return None if value is None else value > 0
