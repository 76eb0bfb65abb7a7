"""Operations records -> ``alerts`` and ``remediation_actions`` rows.

The sink consumes ``<prefix>.alerts`` (the alert receiver's records) and
``<prefix>.remediations`` (the remediator's audit) next to the telemetry
topics; :mod:`stepwatch.contract.ops` defines both records. A record that does
not decode becomes a dead letter like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from stepwatch.contract.ops import AlertRecord, RemediationRecord, decode_alert, decode_remediation
from stepwatch.contract.topics import ALERTS, REMEDIATIONS, unprefixed
from stepwatch.exporters.clickhouse import rows as R

ACTOR = "stepwatch-remediator"
DRY_RUN = "dry_run"

Mapper = Callable[[bytes], tuple[R.Table, tuple[Any, ...]]]


def alert_row(rec: AlertRecord) -> tuple[Any, ...]:
    return (
        rec.received_at,
        rec.fingerprint,
        rec.alertname,
        rec.status,
        rec.severity,
        rec.starts_at,
        rec.ends_at,
        rec.job_id,
        rec.host,
        dict(rec.labels),
        dict(rec.annotations),
    )


def remediation_row(rec: RemediationRecord) -> tuple[Any, ...]:
    """A decision as a ``remediation_actions`` row (schema 0004 + 0006)."""
    return (
        round(rec.ts, 3),
        rec.id,
        rec.action,
        rec.outcome,
        rec.outcome == DRY_RUN,
        rec.job_id,
        rec.host,
        "",
        rec.fingerprint,
        rec.reason,
        rec.detail,
        ACTOR,
        rec.mode,
        rec.alertname,
        rec.cause,
        rec.alert_class,
    )


def _alert(payload: bytes) -> tuple[R.Table, tuple[Any, ...]]:
    return R.ALERTS, alert_row(decode_alert(payload))


def _remediation(payload: bytes) -> tuple[R.Table, tuple[Any, ...]]:
    return R.REMEDIATIONS, remediation_row(decode_remediation(payload))


def ops_mappers(topics: Iterable[str]) -> dict[str, Mapper]:
    """The operations topics among ``topics`` (``<prefix>.alerts``, ``<prefix>.remediations``)."""
    out: dict[str, Mapper] = {}
    for topic in topics:
        name = unprefixed(topic)
        if name == ALERTS:
            out[topic] = _alert
        elif name == REMEDIATIONS:
            out[topic] = _remediation
    return out
