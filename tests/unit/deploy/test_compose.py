"""docker-compose.yml agrees with the project (no Docker engine here): files it mounts
exist, env names are real settings, ports match the settings' defaults and the
scrape/webhook/data-source addresses, services referenced exist, commands parse."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from stepwatch.settings import Settings
from tests.support import paths

yaml = pytest.importorskip("yaml")
pytestmark = pytest.mark.unit

ROOT = paths.ROOT
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
FIELDS = {f.name for f in dataclasses.fields(Settings)}
DEFAULTS = Settings.load(env={})
STEPWATCH = [
    n
    for n, s in SERVICES.items()
    if str(s.get("image", "")).startswith("stepwatch") and "command" in s
]
# subcommands of services another branch brings; checked once they are registered
PENDING = {"remediate"}


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def published(service: str) -> set[int]:
    out = set()
    for p in SERVICES[service].get("ports", []):
        out.add(int(str(p).split(":")[-1]))
    return out | {int(p) for p in SERVICES[service].get("expose", [])}


def test_every_mounted_or_built_file_exists() -> None:
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (ROOT / src).exists(), f"{name}: {src}"
            else:
                assert src.startswith("/") or src in COMPOSE["volumes"], f"{name}: volume {src}"
        for secret in svc.get("secrets", []):
            key = secret if isinstance(secret, str) else secret["source"]
            assert (ROOT / COMPOSE["secrets"][key]["file"]).exists()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src


def test_dockerfile_extras_are_defined() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    wanted = re.search(r"'\.\[([a-z,]+)\]'", (ROOT / "Dockerfile").read_text()).group(1).split(",")
    assert set(wanted) <= set(extras)


def test_stepwatch_env_names_are_settings_and_values_load() -> None:
    for name in STEPWATCH:
        values = env(name)
        for key in values:
            assert key.startswith("STEPWATCH_") and key[10:].lower() in FIELDS, f"{name}: {key}"
        Settings.load(env=values)  # every value parses


def test_ports_match_the_settings_and_who_scrapes_them() -> None:
    wanted = {
        "stream": DEFAULTS.stream_metrics_port,
        "sink": DEFAULTS.sink_metrics_port,
        "agent": DEFAULTS.metrics_port,
    }
    if "remediate_port" in FIELDS:
        wanted["remediator"] = DEFAULTS.remediate_port  # type: ignore[attr-defined]
    for service, port in wanted.items():
        assert port in published(service), (service, port)
        settings = Settings.load(env=env(service))
        field = {
            "stream": "stream_metrics_port",
            "sink": "sink_metrics_port",
            "agent": "metrics_port",
            "remediator": "remediate_port",
        }[service]
        assert getattr(settings, field) == port
    prom = yaml.safe_load((ROOT / "deploy/compose/prometheus.yml").read_text())
    for job in prom["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for host in sd["names"]:
                assert sd["port"] in published(host), job["job_name"]
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.split(":")
                assert int(port) in published(host), target
    am_targets = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert all(int(t.split(":")[1]) in published(t.split(":")[0]) for t in am_targets)


def test_addresses_point_at_services_and_their_ports() -> None:
    base = env("stream")
    host, port = base["STEPWATCH_BOOTSTRAP_SERVERS"].split(":")
    advertised = env("kafka")["KAFKA_ADVERTISED_LISTENERS"]
    assert f"PLAINTEXT://{host}:{port}" in advertised and host == "kafka"
    host_port = re.search(r"PLAINTEXT_HOST://localhost:(\d+)", advertised).group(1)
    assert int(host_port) in published("kafka")  # reachable from the host as well
    url = urlsplit(base["STEPWATCH_CLICKHOUSE_URL"])
    assert url.hostname == "clickhouse" and url.port in published("clickhouse")
    assert base["STEPWATCH_CLICKHOUSE_USER"] == env("clickhouse")["CLICKHOUSE_USER"]
    assert base["STEPWATCH_CLICKHOUSE_PASSWORD"] == env("clickhouse")["CLICKHOUSE_PASSWORD"]
    for name, svc in SERVICES.items():
        for dep in svc.get("depends_on", {}):
            assert dep in SERVICES, f"{name} depends on {dep}"


def test_alertmanager_config_is_the_shipped_tree_with_compose_receivers() -> None:
    from stepwatch.alerts.config import Receivers, alertmanager_config

    text = (ROOT / "deploy/compose/alertmanager.yml").read_text()
    body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    am = yaml.safe_load(body)
    hooks = [c["url"] for r in am["receivers"] for c in r.get("webhook_configs", [])]
    remediator = next(u for u in hooks if u.endswith("/webhook"))
    u = urlsplit(remediator)
    assert u.hostname == "remediator" and u.port in published("remediator")
    token = next(
        c["http_config"]["authorization"]["credentials_file"]
        for r in am["receivers"]
        for c in r.get("webhook_configs", [])
        if c["url"] == remediator
    )
    mounted = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["alertmanager"]["volumes"]}
    assert mounted[str(Path(token).parent)] == "secrets", "the token comes from the secrets volume"
    argv = SERVICES["remediator"]["command"]
    assert argv[argv.index("--token-file") + 1] == token
    pager, tickets = (next(u for u in hooks if u.endswith(s)) for s in ("/page", "/ticket"))
    assert body == alertmanager_config(Receivers(remediator, token, pager, tickets))


def test_grafana_gets_every_variable_its_provisioning_expands() -> None:
    text = (ROOT / "dashboards/provisioning/datasources/stepwatch.yml").read_text()
    names = set(re.findall(r"\$\{(\w+)\}", text))
    assert names and names <= set(env("grafana"))
    ds = yaml.safe_load(text)["datasources"]
    assert {d["type"] for d in ds} == {"prometheus", "grafana-clickhouse-datasource"}
    g = env("grafana")
    assert urlsplit(g["PROMETHEUS_URL"]).port in published("prometheus")
    assert int(g["CLICKHOUSE_PORT"]) in published("clickhouse")
    assert "grafana-clickhouse-datasource" in g["GF_INSTALL_PLUGINS"]


def test_stepwatch_commands_parse() -> None:
    from stepwatch.agents.collectors import NAMES
    from stepwatch.cli import SUBCOMMANDS, build_parser
    from stepwatch.sim import parse_fault

    parser = build_parser()
    for name in STEPWATCH:
        argv = [str(a) for a in SERVICES[name]["command"]]
        if argv[0] in PENDING and argv[0] not in SUBCOMMANDS:
            continue
        args = parser.parse_args(argv)
        assert args.func, shlex.join(argv)
        if argv[0] == "agent":
            assert set(args.collectors.split(",")) <= set(NAMES)
        for spec in getattr(args, "fault", None) or []:
            parse_fault(spec)
    assert "remediate" in {str(SERVICES[n]["command"][0]) for n in STEPWATCH}


def test_no_token_is_committed_and_one_is_generated_once(tmp_path: Path) -> None:
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout
    assert not [f for f in files.splitlines() if f.endswith(".token")], "a committed token"
    assert "secrets" not in COMPOSE, "tokens are generated at first start, not compose file secrets"
    init = SERVICES["secrets-init"]
    script, path = init["entrypoint"][2], init["entrypoint"][3]
    assert any(v.split(":")[1] == str(Path(path).parent) for v in init["volumes"])
    token = tmp_path / "remediator.token"
    for _ in range(2):  # a restart keeps the first token
        done = subprocess.run(
            ["python3", "-c", script, str(token)],
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.umask(0o022),
        )  # a container's
        assert done.returncode == 0, done.stderr
        if _ == 0:
            first = token.read_text()
    assert token.read_text() == first and len(first.strip()) >= 40
    assert token.stat().st_mode & 0o777 == 0o440
    for name in ("remediator", "alertmanager"):
        assert SERVICES[name]["depends_on"]["secrets-init"] == {
            "condition": "service_completed_successfully"
        }


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies() -> None:
    for name, svc in SERVICES.items():
        if name in ("secrets-init", "simulator"):  # a one-shot job; a publisher with no port
            continue
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond["condition"] in ("service_healthy", "service_completed_successfully"), name
            if cond["condition"] == "service_healthy":
                assert SERVICES[dep].get("healthcheck"), f"{name} waits for {dep}, which has none"
    assert SERVICES["sink"]["depends_on"]["clickhouse"] == {"condition": "service_healthy"}


def test_stepwatch_healthchecks_name_their_port_and_readiness_gauge() -> None:
    for name in ("stream", "sink", "agent"):
        argv = SERVICES[name]["healthcheck"]["test"]
        assert argv[:2] == ["CMD", "stepwatch-healthcheck"], name
        assert int(argv[2]) in published(name) and argv[3].endswith("_ready"), name
    assert (
        "COPY deploy/healthcheck.py /usr/local/bin/stepwatch-healthcheck"
        in (ROOT / "Dockerfile").read_text()
    )


def test_the_remediator_image_and_policy_fit_a_host_without_a_scheduler() -> None:
    from stepwatch.alerts.remediate.policy import load

    svc = SERVICES["remediator"]
    assert svc["build"]["target"] == "remediator"
    docker = (ROOT / "Dockerfile").read_text()
    assert "FROM base AS remediator" in docker and "slurm-client" in docker
    assert "remediate" in re.search(r"'\.\[([a-z,]+)\]'", docker).group(1).split(",")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    argv = svc["command"]
    policy = load(ROOT / mounts[argv[argv.index("--policy") + 1]])
    assert policy.mode.value == "observe" and policy.actuator["kind"] == "log"
    assert argv[argv.index("--mode") + 1] == "observe"
