"""Did the remediation help? An executed drain/requeue waits for its alert to resolve.

When the alert that led to an executed action resolves (Alertmanager sends
``status: resolved`` with ``send_resolved: true``) before the deadline and
stays resolved for ``settle`` (it may fire again once the restarted job has
warmed up), the outcome is ``recovered`` - unless both step times are known
and the job is not at least ``min_gain`` faster than before the action
(``not_recovered``, ``step_time_not_back``); still firing at the deadline:
``not_recovered``. Each not recovered pages the on-call: a remediation that did not help is itself a
finding. Each outcome is one audit decision and counts in
``stepwatch_remediation_outcomes_total{outcome}``. With a Prometheus URL the
job's step time (``stepwatch_job_step_seconds``) before the action and at the
outcome is recorded as evidence. :class:`OutcomeTimer` runs the deadline
check on a background thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from stepwatch.alerts.remediate import identity
from stepwatch.alerts.remediate.actuators.base import Notifier
from stepwatch.alerts.remediate.audit import AuditSink
from stepwatch.alerts.remediate.model import (
    ActionKind,
    Alert,
    Decision,
    Mode,
    Outcome,
    alert_key,
)
from stepwatch.alerts.remediate.policy import OutcomeSettings
from stepwatch.alerts.remediate.state import OutcomeRow, State
from stepwatch.errors import ActuatorError

log = logging.getLogger(__name__)
STEP_METRIC = "stepwatch_job_step_seconds"


def promql_string(value: str) -> str:
    """A PromQL string literal (Go's quoting, which JSON's is a subset of): a label value the
    sender chose never ends the string and rewrites the query."""
    # non-ASCII as itself: JSON's surrogate pairs for characters past U+FFFF are not Go's
    return json.dumps(value, ensure_ascii=False)


def alerts_selector(alertname: str, host: str, job_id: str) -> str:
    """The firing ``ALERTS`` series of one alert name, host and job (an empty value: the
    label absent), every value quoted: the remediator's question before it acts
    (:mod:`.confirm`) and after (:class:`StillFiring`)."""
    match = [
        'alertstate="firing"',
        f"alertname={promql_string(alertname)}",
        f"host={promql_string(host)}",
        f"job_id={promql_string(job_id)}",
    ]
    return "ALERTS{" + ",".join(match) + "}"


MAX_ANSWER = 1 << 20  # bytes of a Prometheus answer read at most
IN_FLIGHT = 2  # queries to Prometheus still running at once; more: no answer
DOWN_SECONDS = 15.0  # after a query without an answer, none is asked for this long


class Prometheus:
    """Instant queries to Prometheus, when a URL is set (None: unknown or unreachable).

    ``timeout`` bounds the whole query, not each socket read: a Prometheus (or a proxy)
    that trickles its answer a byte at a time held a webhook, and the decision lock every
    other webhook and approval waits for, far past it. A query still running then goes
    on in a daemon thread; while ``IN_FLIGHT`` of them do, the next gets no answer. After
    a query without an answer none is asked for ``down_s``: a stalled Prometheus cost
    each webhook its timeout in turn (six webhooks: 30 s)."""

    def __init__(self, url: str, timeout: float = 5.0, down_s: float = DOWN_SECONDS) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.down_s = down_s
        self._slots = threading.BoundedSemaphore(IN_FLIGHT)
        self._down_until = 0.0  # monotonic: no question before (Prometheus did not answer)

    def value(self, promql: str, what: str) -> float | None:
        """The first sample's value; 0.0 for an empty result."""
        result = self.series(promql, what)
        if result is None:
            return None
        try:
            return float(result[0]["value"][1]) if result else 0.0
        except (ValueError, KeyError, IndexError, TypeError) as err:
            log.warning("%s unavailable query=%s error=%s", what, promql, err)
            return None

    def series(self, promql: str, what: str) -> list[dict[str, Any]] | None:
        """The instant vector's series (``metric`` labels and ``value``); None: no answer."""
        if not self.url or self.is_down():
            return None  # unset, or did not answer lately: each webhook waited its timeout
        try:
            query = urllib.parse.urlencode({"query": promql})
        except UnicodeError as err:  # a lone surrogate from a sender: no question to ask
            log.warning("%s not asked query=%r error=%s", what, promql, err)
            return None
        try:
            result = json.loads(self._fetch(f"{self.url}/api/v1/query?{query}"))["data"]["result"]
            if not isinstance(result, list):
                raise ValueError("the answer is not an instant vector")
            return result
        except urllib.error.HTTPError as err:
            if 400 <= err.code < 500 and err.code != 429:
                # Prometheus refused this question (a name it cannot parse), not every
                # question: one alert sent with such a name marked Prometheus down, and
                # every real alert for 15 s was refused unconfirmed
                log.warning("%s refused query=%s error=%s", what, promql, err)
                return None
            self._down(what, promql, err)
            return None
        except Exception as err:  # any answer that is not one (http.client's errors too)
            self._down(what, promql, err)
            return None

    def is_down(self) -> bool:
        """Whether Prometheus did not answer lately (no question is asked meanwhile)."""
        return time.monotonic() < self._down_until

    def _down(self, what: str, promql: str, err: BaseException) -> None:
        self._down_until = time.monotonic() + self.down_s
        log.warning(
            "%s unavailable query=%s error=%r (not asked again for %g s)",
            what,
            promql,
            err,
            self.down_s,
        )

    def _fetch(self, url: str) -> bytes:
        if not self._slots.acquire(blocking=False):
            raise TimeoutError(f"{IN_FLIGHT} earlier queries to Prometheus still run")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["body"] = self._get(url)
            except Exception as err:  # handed to the caller, which logs it
                box["error"] = err
            finally:
                self._slots.release()

        thread = threading.Thread(target=run, name="prometheus-query", daemon=True)
        try:
            thread.start()
        except BaseException:  # no thread: its slot is given back (else 2 and no more queries)
            self._slots.release()
            raise
        thread.join(self.timeout)
        if thread.is_alive():
            raise TimeoutError(f"no whole answer within {self.timeout:g} s")
        if "error" in box:
            raise box["error"]
        return bytes(box["body"])

    def _get(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=self.timeout) as resp:
            body = bytes(resp.read(MAX_ANSWER + 1))
        if len(body) > MAX_ANSWER:
            raise ValueError(f"an answer over {MAX_ANSWER} bytes")
        return body


class StepTimes(Prometheus):
    """The job's current step time from Prometheus (None when unknown or unreachable)."""

    def __call__(self, job_id: str) -> float | None:
        if not identity.job_ok(job_id, "label"):
            return None
        value = self.value(f'max({STEP_METRIC}{{job_id="{job_id}"}})', "step time")
        return value or None  # no series: unknown


class StillFiring(Prometheus):
    """Whether Prometheus still fires the remediated alert (``ALERTS``), by the labels the
    action was taken on: a ``resolved`` notification is its sender's word, and one posted
    with the alert's fingerprint ended the watch of a remediation that did not help
    (docs/security.md). None: unknown (no URL, unreachable)."""

    def __call__(self, row: OutcomeRow) -> bool | None:
        query = "count(" + alerts_selector(row.alertname, row.node, row.job_id) + ")"
        value = self.value(query, "alert state")
        return None if value is None else value > 0


class OutcomeTracker:
    def __init__(
        self,
        state: State,
        settings: OutcomeSettings,
        pager: Notifier,
        audit: AuditSink,
        *,
        mode: Mode,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.state = state
        self.settings = settings
        self.pager = pager
        self.audit = audit
        self.mode = mode
        self.clock = clock
        self.step_time = StepTimes(settings.prometheus_url)
        self.still_firing = StillFiring(settings.prometheus_url)
        self._lock = threading.Lock()
        self.counter = (
            Counter(
                "stepwatch_remediation_outcomes_total",
                "Executed remediations by what became of their alert",
                ["outcome"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    def acted(self, alert: Alert, kind: ActionKind) -> None:
        """An action of this alert was executed: start (or extend) its outcome watch."""
        if kind not in (ActionKind.DRAIN, ActionKind.REQUEUE):
            return
        key, now = alert_key(alert), self.clock()
        with self._lock:
            row = self.state.outcome(key)
            if row is not None and not row.outcome:
                actions = "+".join(sorted(set(row.action.split("+")) | {kind.value}))
                self.state.put_outcome(OutcomeRow(**{**row.__dict__, "action": actions}))
                return
            self.state.put_outcome(
                OutcomeRow(
                    key,
                    alert.fingerprint,
                    identity.word(alert.name),
                    kind.value,
                    alert.host,
                    alert.job_id,
                    now,
                    now + self.settings.deadline_s,
                    before=self.step_time(alert.job_id) if alert.job_id else None,
                )
            )

    def resolved(self, alert: Alert) -> list[Decision]:
        """A resolved alert: its pending remediation settles (or is judged now, settle 0)."""
        now = self.clock()
        with self._lock:
            rows = [
                r
                for r in self.state.pending_for(alert.fingerprint)
                if r.key == alert_key(alert) and now <= r.deadline and not r.resolved_at
            ]
            if any(not _same_alert(r, alert) for r in rows):
                log.warning(
                    "resolved alert ignored: its labels are not the remediated alert's "
                    "fingerprint=%s host=%r job_id=%r",
                    alert.fingerprint,
                    identity.text(alert.host, 64),
                    identity.text(alert.job_id, 64),
                )
                rows = [r for r in rows if _same_alert(r, alert)]
            for r in rows:
                self.state.put_outcome(OutcomeRow(**{**r.__dict__, "resolved_at": now}))
        return self.check() if rows and self.settings.settle_s <= 0 else []

    def refired(self, alert: Alert) -> None:
        """The alert fires again while its remediation settles: the settling starts over."""
        with self._lock:
            row = self.state.outcome(alert_key(alert))
            if row is not None and not row.outcome and row.resolved_at:
                self.state.put_outcome(OutcomeRow(**{**row.__dict__, "resolved_at": 0.0}))
                log.info("remediated alert fired again key=%s node=%s", row.key, row.node)

    def check(self) -> list[Decision]:
        """Settled remediations are judged; those past the deadline still firing did not
        help: each not recovered pages a person."""
        now = self.clock()
        with self._lock:
            decisions = [
                self._judge(r, now)
                for r in self.state.settled(now, self.settings.settle_s)
                if not self._firing_after_all(r)
            ]
            decisions += [
                self._decide(r, Outcome.NOT_RECOVERED, now, "still_firing_at_deadline")
                for r in self.state.overdue(now)
            ]
        for d in decisions:
            if d.outcome is Outcome.NOT_RECOVERED:
                self._page(d)
        return decisions

    def _firing_after_all(self, row: OutcomeRow) -> bool:
        """Prometheus still fires the alert that resolved: its settling starts over (as
        when it fires again), and the deadline stands."""
        if not self.still_firing(row):
            return False
        self.state.put_outcome(OutcomeRow(**{**row.__dict__, "resolved_at": 0.0}))
        log.warning(
            "remediated alert resolved but still firing in Prometheus key=%s node=%s",
            row.key,
            row.node,
        )
        return True

    def _judge(self, row: OutcomeRow, now: float) -> Decision:
        """The alert stayed resolved; with both step times known, the job must also be at
        least ``min_gain`` faster than before the action."""
        after = self.step_time(row.job_id) if row.job_id else None
        if (
            row.before is not None
            and after is not None
            and after > row.before * (1.0 - self.settings.min_gain)
        ):
            return self._decide(row, Outcome.NOT_RECOVERED, now, "step_time_not_back", after)
        return self._decide(row, Outcome.RECOVERED, now, "resolved_and_stayed_resolved", after)

    def _decide(
        self, row: OutcomeRow, outcome: Outcome, now: float, reason: str, after: float | None = None
    ) -> Decision:
        if after is None:
            after = self.step_time(row.job_id) if row.job_id else None
        self.state.put_outcome(
            OutcomeRow(**{**row.__dict__, "outcome": outcome.value, "decided": now, "after": after})
        )
        detail = (
            f"{row.action} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(row.acted))}, "
            f"{now - row.acted:.0f} s later"
            f"{_steps(row.before, after)}"
        )
        first = row.action.split("+")[0]
        decision = Decision(
            now,
            f"outcome-{row.key}",
            ActionKind(first),
            outcome,
            self.mode,
            reason,
            row.node,
            row.job_id,
            row.alertname,
            row.fingerprint,
            "",
            "system",
            detail,
        )
        log.info(
            "remediation outcome key=%s outcome=%s node=%s job_id=%s detail=%s",
            row.key,
            outcome.value,
            row.node,
            row.job_id,
            detail,
        )
        self.audit.record(decision)
        if self.counter is not None:
            self.counter.labels(outcome.value).inc()
        return decision

    def _page(self, d: Decision) -> None:
        event = {
            "kind": "page",
            "to": "on-call",
            "alertname": d.alertname,
            "job_id": d.job_id,
            "host": d.node,
            "cause": "",
            "summary": f"remediation did not help: {d.alertname}",
            "text": f"{d.action.value} of {d.node} (job {d.job_id or '-'}) did not resolve "
            f"{d.alertname}: {d.detail}",
        }
        try:
            self.pager.send(event)
        except ActuatorError as err:
            self.audit.actuator_error("pager", err.transient)
            log.error("page failed reason=not_recovered error=%s", err)


class OutcomeTimer:
    """Runs ``tracker.check`` every ``every_s`` seconds on a daemon thread until stopped."""

    def __init__(self, tracker: OutcomeTracker, every_s: float) -> None:
        self.tracker = tracker
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="remediator-outcomes", daemon=True)

    def start(self) -> OutcomeTimer:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.tracker.check()
            except Exception:  # the timer never dies: log, try again next tick
                log.exception("outcome check failed")


def _steps(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return ""
    fmt: Callable[[float | None], str] = lambda v: "?" if v is None else f"{v:.3f} s"  # noqa: E731
    return f"; step time {fmt(before)} -> {fmt(after)}"


def _same_alert(row: OutcomeRow, alert: Alert) -> bool:
    """A resolved alert is the remediated one only with the labels the action was taken on
    (its fingerprint alone is a sender's word)."""
    return alert.host == row.node and alert.job_id == row.job_id
