"""The shipped Alertmanager routing: amtool accepts it, and alerts land where they should."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from stepwatch.alerts.config import ALERTMANAGER_CONFIG, Receivers, alertmanager_config

pytestmark = pytest.mark.skipif(
    shutil.which("amtool") is None, reason="amtool not installed (Debian: prometheus-alertmanager)"
)

SYSTEM = {"class": "system"}
# (labels of an alert, the receivers it must reach, in order)
CASES: list[tuple[dict[str, str], str]] = [
    (
        {
            "alertname": "StragglerPersistent",
            **SYSTEM,
            "remediation": "drain",
            "severity": "critical",
            "scope": "rank",
            "job_id": "j1",
            "host": "node02",
            "cause": "gpu",
        },
        "remediator,oncall-pager",
    ),
    (
        {
            "alertname": "StragglerPersistent",
            **SYSTEM,
            "remediation": "notify",
            "severity": "warning",
            "scope": "rank",
            "job_id": "j1",
            "host": "node02",
            "cause": "host_input",
        },
        "tickets",
    ),
    (
        {
            "alertname": "GpuXidFatal",
            **SYSTEM,
            "remediation": "drain",
            "severity": "critical",
            "scope": "node",
            "host": "node02",
            "xid": "79",
        },
        "remediator,oncall-pager",
    ),
    (
        {
            "alertname": "JobHang",
            **SYSTEM,
            "remediation": "requeue",
            "severity": "critical",
            "scope": "job",
            "job_id": "j1",
        },
        "remediator,oncall-pager",
    ),
    (
        {
            "alertname": "JobUserError",
            "class": "user",
            "remediation": "notify",
            "severity": "warning",
            "scope": "job",
            "job_id": "j1",
        },
        "remediator,tickets",
    ),
    (
        {
            "alertname": "GpuXidApplicationFault",
            "class": "user",
            "remediation": "notify",
            "severity": "info",
            "scope": "gpu",
            "host": "node02",
        },
        "remediator,blackhole",
    ),
    (
        {
            "alertname": "JobThroughputDrop",
            **SYSTEM,
            "remediation": "notify",
            "severity": "warning",
            "scope": "job",
            "job_id": "j1",
        },
        "tickets",
    ),
    (
        {
            "alertname": "RdmaLinkDown",
            **SYSTEM,
            "remediation": "drain",
            "severity": "critical",
            "scope": "port",
            "host": "node03",
            "device": "mlx5_0",
            "port": "1",
        },
        "remediator,oncall-pager",
    ),
    (
        {
            "alertname": "AgentDown",
            **SYSTEM,
            "remediation": "none",
            "severity": "critical",
            "scope": "node",
            "host": "node04",
        },
        "oncall-pager",
    ),
    (
        {
            "alertname": "StreamLagHigh",
            **SYSTEM,
            "remediation": "none",
            "severity": "warning",
            "scope": "pipeline",
            "instance": "w1:9466",
        },
        "tickets",
    ),
    (
        {
            "alertname": "RemediatorCircuitBreakerOpen",
            **SYSTEM,
            "remediation": "none",
            "severity": "critical",
            "scope": "pipeline",
        },
        "oncall-pager",
    ),
    ({"alertname": "Unknown"}, "tickets"),
]


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, check=False)


def test_amtool_accepts_the_config() -> None:
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 inhibit rules" in result.stdout


@pytest.mark.parametrize(("labels", "receivers"), CASES, ids=lambda c: str(c)[:60])
def test_route(labels: dict[str, str], receivers: str) -> None:
    args = [f"{k}={v}" for k, v in labels.items()]
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_CONFIG}",
        f"--verify.receivers={receivers}",
        *args,
    )
    assert result.returncode == 0, f"{labels} routed to {result.stdout.strip()}, want {receivers}"


def test_rendered_config_points_receivers_and_keeps_the_token_out(tmp_path) -> None:
    token = tmp_path / "token"
    text = alertmanager_config(
        Receivers(
            "http://127.0.0.1:1/hook", str(token), "http://127.0.0.1:2/page", "http://127.0.0.1:3/t"
        ),
        fast=True,
    )
    cfg = yaml.safe_load(text)
    hooks = {r["name"]: r.get("webhook_configs", [{}])[0] for r in cfg["receivers"]}
    assert hooks["remediator"]["url"] == "http://127.0.0.1:1/hook"
    assert hooks["remediator"]["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": str(token),
    }
    assert cfg["route"]["routes"][0]["group_wait"] == "1s"
    path = tmp_path / "am.yml"
    path.write_text(text)
    token.write_text("s3cret\n")
    assert amtool("check-config", str(path)).returncode == 0


def test_no_placeholder_receiver_posts_to_a_stepwatch_port() -> None:
    """The pager placeholder was localhost:9470, the remediator's own /alerts receiver:
    a newcomer who followed docs/alerts.md had critical pages go to the remediator."""
    from urllib.parse import urlsplit

    from stepwatch.settings import Settings

    ours = {v for k, v in Settings.load(env={}).describe().items() if k.endswith("_port")}
    cfg = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    for receiver in cfg["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            url = urlsplit(hook["url"])
            if receiver["name"] != "remediator":
                assert url.port not in ours, (receiver["name"], hook["url"])
