"""Where stepwatch's alert rules and Alertmanager routing live, and a deployable
copy of the routing.

The files are data shipped with the package (``alerts/src/stepwatch/alerts/rules/*.yml``,
``alerts/src/stepwatch/alerts/alertmanager/alertmanager.yml``,
``alerts/src/stepwatch/alerts/tests/*.yml`` for promtool).
:func:`alertmanager_config` returns the routing with the receivers pointed at
real endpoints, for the demo, the integration tests and a quick deployment:
the tree, grouping and inhibition stay exactly as shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwatch.errors import ConfigError

HERE = Path(__file__).resolve().parent
RULES_DIR = HERE / "rules"
RULE_TESTS_DIR = HERE / "tests"
ALERTMANAGER_CONFIG = HERE / "alertmanager" / "alertmanager.yml"
# Where the shipped rules' runbook_url annotations point (absolute, as monitoring-mixins
# require): the project's published docs/runbooks.md. Rebase them on your own copy with
# `make kube RUNBOOK_BASE_URL=...` (stepwatch.alerts.kube).
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/stepwatch/stepwatch/blob/main/docs/runbooks.md"


def rule_files() -> list[Path]:
    """Every Prometheus rule file stepwatch ships, sorted."""
    return sorted(RULES_DIR.glob("*.yml"))


def rule_test_files() -> list[Path]:
    """Every promtool unit-test file for those rules, sorted."""
    return sorted(RULE_TESTS_DIR.glob("*_test.yml"))


@dataclass(frozen=True)
class Receivers:
    """The three endpoints the routing sends to, and the remediator's token file.

    ``store_url`` (optional): the alert receiver (``stepwatch alerts receive``,
    ``http://host:9470/alerts``) that records every alert, firing and resolved, in
    the store; a first route sends it everything and continues down the tree.
    """

    remediator_url: str
    token_file: str
    pager_url: str
    tickets_url: str
    store_url: str = ""


def alertmanager_config(receivers: Receivers, *, fast: bool = False) -> str:
    """The shipped routing as YAML text with ``receivers`` filled in.

    ``fast`` shortens every group wait/interval to 1 s (tests and the demo only).
    """
    import yaml

    try:
        cfg: dict[str, Any] = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"cannot read {ALERTMANAGER_CONFIG}: {err}") from err
    urls = {
        "remediator": receivers.remediator_url,
        "oncall-pager": receivers.pager_url,
        "tickets": receivers.tickets_url,
    }
    for receiver in cfg["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = urls[receiver["name"]]
            auth = hook.get("http_config", {}).get("authorization")
            if auth is not None:
                auth["credentials_file"] = receivers.token_file
    if receivers.store_url:
        _add_store(cfg, receivers)
    if fast:
        _speed_up(cfg["route"])
    return str(yaml.safe_dump(cfg, sort_keys=False))


def _add_store(cfg: dict[str, Any], receivers: Receivers) -> None:
    """Every alert to the store's receiver first (firing and resolved), then the tree as is."""
    cfg["receivers"].append(
        {
            "name": "store",
            "webhook_configs": [
                {
                    "url": receivers.store_url,
                    "send_resolved": True,
                    "max_alerts": 0,
                    "http_config": {
                        "authorization": {
                            "type": "Bearer",
                            "credentials_file": receivers.token_file,
                        }
                    },
                }
            ],
        }
    )
    route = {
        "receiver": "store",
        "matchers": [],
        "group_by": ["alertname", "job_id", "host"],
        "group_wait": "0s",
        "group_interval": "10s",
        "repeat_interval": "4h",
        "continue": True,
    }
    cfg["route"]["routes"] = [route, *cfg["route"].get("routes", [])]


def _speed_up(route: dict[str, Any]) -> None:
    for key in ("group_wait", "group_interval"):
        route[key] = "1s"
    if "repeat_interval" in route:
        route["repeat_interval"] = "1m"
    for child in route.get("routes", []):
        _speed_up(child)
