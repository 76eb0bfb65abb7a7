"""Parse an Alertmanager webhook body (payload version 4) into :class:`Alert` records."""

from __future__ import annotations

import json
from typing import Any

from stepwatch.alerts.remediate.model import Alert
from stepwatch.errors import RemediationError

MAX_ALERTS = 1000  # Alertmanager's max_alerts is 0 (all) by default; cap what one body may carry


class PayloadError(RemediationError):
    """The body is not a valid version-4 webhook payload (the server answers 400)."""


def parse(body: bytes) -> list[Alert]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting
        raise PayloadError(f"not JSON: {err}") from err
    if not isinstance(data, dict):
        raise PayloadError("payload is not a JSON object")
    if str(data.get("version")) != "4":
        raise PayloadError(f'unsupported payload version {data.get("version")!r} (want "4")')
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("payload has no 'alerts' list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"payload carries {len(alerts)} alerts (at most {MAX_ALERTS})")
    return [_alert(i, a) for i, a in enumerate(alerts)]


def _alert(index: int, raw: Any) -> Alert:
    if not isinstance(raw, dict):
        raise PayloadError(f"alerts[{index}] is not an object")
    fingerprint = raw.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise PayloadError(f"alerts[{index}] has no fingerprint")
    return Alert(
        fingerprint=fingerprint,
        status=str(raw.get("status", "firing")),
        labels=_strings(index, "labels", raw.get("labels")),
        annotations=_strings(index, "annotations", raw.get("annotations") or {}),
        starts_at=str(raw.get("startsAt", "")),
    )


def _strings(index: int, name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PayloadError(f"alerts[{index}].{name} is not a map of strings")
    return dict(value)
