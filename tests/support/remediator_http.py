"""The real remediator service over HTTP for the attack and outcome tests.

:func:`start` builds the service exactly as ``stepwatch remediate serve``
does (policy file, webhook token, operators file, state dir), with the Slurm
actuator calling whatever ``scontrol`` is first on PATH. :func:`webhook` makes an
Alertmanager-v4 body as Alertmanager 0.25 sends it. ``TOKEN`` is the webhook's
(Alertmanager's) token; ``OPERATOR_TOKEN`` is operator ``OPERATOR``'s, what the
API (:func:`get`, approvals, close-breaker) needs.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from stepwatch.alerts.remediate.service import Service, build
from stepwatch.settings import Settings

TOKEN = "attack-suite-token"
OPERATOR, OPERATOR_TOKEN = "alice", "attack-suite-operator-alice"
RULES = [
    {
        "match": {"alertname": "StragglerPersistent", "class": "system", "remediation": "drain"},
        "actions": ["drain", "requeue"],
    },
    {
        "match": {"alertname": "GpuXidFatal", "class": "system"},
        "actions": ["drain"],
        "scope": "node",
    },
    {"match": {"class": "user"}, "actions": ["notify"]},
]


def start(
    tmp: Path,
    *,
    mode: str = "execute",
    guardrails: dict[str, Any] | None = None,
    notify: str = "",
    page: str = "",
    actuator: dict[str, Any] | None = None,
    **policy: Any,
) -> Service:
    doc = {
        "mode": mode,
        "rules": RULES,
        "guardrails": {
            "breaker": {"max_share": 0.5, "window": "1h"},
            "rate_limit": {"actions": 20, "per": "1h"},
            "cooldown": {"node": "1h", "job": 0},
            **(guardrails or {}),
        },
        "actuator": actuator or {"kind": "slurm"},
        "notify": {"kind": "webhook", "url": notify} if notify else {"kind": "log"},
        "page": {"kind": "webhook", "url": page} if page else {"kind": "log"},
        **policy,
    }
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    token = tmp / "token"
    token.write_text(TOKEN)
    operators = tmp / "operators"
    operators.write_text(f"{OPERATOR}:{OPERATOR_TOKEN}\n")
    settings = Settings.load(
        env={},
        remediate_policy=str(path),
        remediate_token_file=str(token),
        remediate_operators_file=str(operators),
        remediate_state_dir=str(tmp / "state"),
    )
    return build(settings, port=0, writers=[])


def alert(
    host: str,
    job: str = "43",
    name: str = "StragglerPersistent",
    status: str = "firing",
    **labels: str,
) -> dict[str, Any]:
    lab = {
        "alertname": name,
        "host": host,
        "job_id": job,
        "rank": "3",
        "cause": "gpu",
        "fault": "system",
        "class": "system",
        "remediation": "drain",
        "severity": "page",
        "scope": "rank",
        **labels,
    }
    lab = {k: v for k, v in lab.items() if v != ""}
    fp = hashlib.sha256(json.dumps(sorted(lab.items())).encode()).hexdigest()[:16]
    return {
        "status": status,
        "labels": lab,
        "annotations": {"summary": f"straggler on {host}", "runbook_url": "docs/runbooks.md"},
        "startsAt": "2026-11-25T16:00:00.000Z",
        "endsAt": "2026-11-25T16:10:00.000Z" if status == "resolved" else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=x",
        "fingerprint": fp,
    }


def webhook(alerts: list[dict[str, Any]], status: str = "firing") -> bytes:
    first = alerts[0]["labels"] if alerts else {}
    name = first.get("alertname", "")
    return json.dumps(
        {
            "version": "4",
            "groupKey": '{}/{class="system"}:{alertname="' + name + '"}',
            "truncatedAlerts": 0,
            "status": status,
            "receiver": "remediator",
            "groupLabels": {"alertname": first.get("alertname", "")},
            "commonLabels": {"alertname": first.get("alertname", "")},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": alerts,
        }
    ).encode()


def post(url: str, body: bytes = b"", token: str = TOKEN) -> tuple[int, Any]:
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def send(svc: Service, alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    code, body = post(svc.url + "/webhook", webhook(alerts))
    assert code == 200, body
    return list(body["decisions"])


def get(svc: Service, path: str) -> Any:
    """The API as the operator (``/metrics`` needs no token)."""
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    req = urllib.request.Request(svc.url + path, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return raw.decode() if path == "/metrics" else json.loads(raw)
