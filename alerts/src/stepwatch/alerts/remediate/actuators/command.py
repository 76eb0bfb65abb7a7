"""Generic backends: run a command, or POST JSON to a webhook.

A command's argv may use ``{action}``, ``{node}``, ``{job_id}`` and ``{reason}``;
exit status 0 is success, 75 (``EX_TEMPFAIL``) a transient failure, anything
else permanent. A webhook answering 5xx or 429, or not answering, is transient;
any other 4xx is permanent.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from stepwatch.alerts.remediate.actuators.base import NodeState
from stepwatch.alerts.remediate.identity import require_job, require_node
from stepwatch.errors import ActuatorError, ConfigError

EX_TEMPFAIL = 75


def run_template(argv: Sequence[str], values: Mapping[str, str], timeout: float) -> str:
    if not argv:
        raise ConfigError("a command actuator or notifier needs a non-empty argv")
    try:
        cmd = [a.format(**values) for a in argv]
    except (KeyError, IndexError) as err:
        raise ActuatorError(
            f"command template has an unknown field {err}", transient=False
        ) from err
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as err:
        raise ActuatorError(f"{cmd[0]} not found", transient=False) from err
    except subprocess.TimeoutExpired as err:
        raise ActuatorError(f"{cmd[0]} timed out after {timeout:.0f} s", transient=True) from err
    if done.returncode != 0:
        raise ActuatorError(
            f"{cmd[0]} exited {done.returncode}: {done.stderr.strip()[:300]}",
            transient=done.returncode == EX_TEMPFAIL,
        )
    return done.stdout.strip()[:300]


class CommandActuator:
    """Runs ``argv`` for every action; the node count comes from the policy."""

    name = "command"

    def __init__(self, argv: Sequence[str], timeout: float = 30.0, nodes: int = 0) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.nodes = nodes

    def node_state(self, node: str) -> NodeState:
        return NodeState(True, False)  # a command backend cannot see the scheduler

    def node_count(self) -> int:
        return self.nodes

    def drain(self, node: str, reason: str) -> str:
        return run_template(
            self.argv,
            {"action": "drain", "node": require_node(node), "job_id": "", "reason": reason},
            self.timeout,
        )

    def requeue(self, job_id: str, exclude_node: str) -> str:
        return run_template(
            self.argv,
            {
                "action": "requeue",
                "node": require_node(exclude_node),
                "job_id": require_job(job_id, "label"),  # the engine's scheme for a command
                "reason": "",
            },
            self.timeout,
        )

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        return None  # a command backend cannot see the scheduler

    def job_owner(self, job_id: str) -> str:
        return ""


class CommandNotifier:
    """Runs ``argv`` with the event as JSON on stdin-like ``{event}`` plus the fields."""

    def __init__(self, argv: Sequence[str], timeout: float = 30.0) -> None:
        self.argv = list(argv)
        self.timeout = timeout

    def send(self, event: Mapping[str, Any]) -> None:
        values = {k: str(v) for k, v in event.items()}
        values.setdefault("node", str(event.get("host", "")))
        values["event"] = json.dumps(event, sort_keys=True)
        run_template(self.argv, values, self.timeout)


class WebhookNotifier:
    """POSTs the event as JSON to ``url``."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.timeout = timeout

    def send(self, event: Mapping[str, Any]) -> None:
        post_json(self.url, event, self.timeout)


def post_json(
    url: str, body: Mapping[str, Any], timeout: float, headers: Mapping[str, str] | None = None
) -> bytes:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as err:
        raise ActuatorError(
            f"POST {url}: HTTP {err.code}", transient=err.code >= 500 or err.code == 429
        ) from err
    except (urllib.error.URLError, OSError) as err:
        raise ActuatorError(f"POST {url}: {err}", transient=True) from err
