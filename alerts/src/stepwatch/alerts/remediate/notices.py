"""Messages to people: the job owner's notices (user errors) and the events the pager gets.

Owner notices have their own limits (``guardrails.notify``: per owner and in
all, per window), and so have escalation pages (``guardrails.pages``: per node
and reason, and in all, per window) and carry only what stepwatch builds: checked identities, the
alert's name and cause as plain words, and its summary reduced to one bounded
plain line. The sender's other annotations (description, ...) are not passed on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from stepwatch.alerts.remediate import identity
from stepwatch.alerts.remediate.actuators.base import Actuator, Notifier
from stepwatch.alerts.remediate.guards import NOTIFY, PAGE
from stepwatch.alerts.remediate.lookups import Lookups
from stepwatch.alerts.remediate.model import Alert
from stepwatch.alerts.remediate.policy import Guardrails
from stepwatch.alerts.remediate.state import State
from stepwatch.errors import ActuatorError

log = logging.getLogger(__name__)
SUMMARY_MAX = 200


class Notices:
    def __init__(
        self,
        state: State,
        g: Guardrails,
        owner: Notifier,
        actuator: Actuator,
        clock: Callable[[], float],
    ) -> None:
        self.state = state
        self.g = g
        self.notifier = owner
        self.actuator = actuator
        self.clock = clock

    def check(self, alert: Alert, lookups: Lookups) -> tuple[str | None, str]:
        """(skip reason or None, the owner): the global limit first, then the owner's."""
        since = self.clock() - self.g.notify_window_s
        if self.state.count(NOTIFY, since) >= self.g.notify_total:
            return "notify_rate_limited", ""
        owner = self.owner_of(alert, lookups)
        if self.state.count(NOTIFY, since, ref=owner) >= self.g.notify_per_owner:
            return "notify_owner_limited", owner
        return None, owner

    def page_limit(self, alert: Alert, reason: str) -> str | None:
        """Why an escalation's page is not sent (None: send it): the node's page for this
        reason in this window went out already, or the window's pages are spent."""
        since = self.clock() - self.g.page_window_s
        if self.state.count(PAGE, since, node=alert.host, ref=reason) >= self.g.page_per_node:
            return "page_node_limited"
        if self.state.count(PAGE, since) >= self.g.page_total:
            return "page_rate_limited"
        return None

    def paged(self, alert: Alert, reason: str) -> None:
        self.state.record(self.clock(), PAGE, alert.host, alert.job_id, reason)

    def send(self, alert: Alert, text: str, owner: str) -> str:
        self.notifier.send(self.event("notify", alert, text, owner))
        self.state.record(self.clock(), NOTIFY, alert.host, alert.job_id, owner)
        return f"owner {owner or '(unknown)'} notified"

    def owner_of(self, alert: Alert, lookups: Lookups) -> str:
        """The scheduler's owner of the alert's job when it names one (Slurm), else the
        alert's ``owner`` (or ``user``) label when plain (Kubernetes has no job owner; a
        job the scheduler no longer knows).
        Before, the label came first: whoever could post an alert chose who was told,
        and a job's user errors could be sent to someone else."""
        try:
            found = self._scheduler_owner(alert, lookups)
        except ActuatorError as err:  # e.g. a job Slurm has forgotten: the label, if any
            log.warning("job owner unknown job_id=%s error=%s", alert.job_id, err)
            found = ""
        if found:
            return found
        owner = alert.labels.get("owner") or alert.labels.get("user", "")
        return owner if identity.OWNER.fullmatch(owner) else ""

    def _scheduler_owner(self, alert: Alert, lookups: Lookups) -> str:
        if not alert.job_id or not identity.job_ok(
            alert.job_id, identity.scheme_of(self.actuator.name)
        ):
            return ""
        found = lookups.job_owner(alert.job_id)
        return found if identity.OWNER.fullmatch(found) else ""

    def event(self, kind: str, alert: Alert, text: str, to: str) -> dict[str, object]:
        """What a notifier gets: identities checked already, everything else plain and bounded."""
        return {
            "kind": kind,
            "to": to,
            "alertname": identity.word(alert.name),
            "job_id": alert.job_id,
            "host": alert.host,
            "cause": identity.word(alert.cause),
            "summary": identity.text(alert.summary(), SUMMARY_MAX),
            "text": identity.text(text, 400),
        }
