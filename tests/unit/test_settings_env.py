"""Unknown STEPWATCH_* variables are reported with the closest setting, once; `stepwatch
config` groups the settings by the service that reads them."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest

from stepwatch.settings import OTHER_ENV, Settings, unknown_env
from tests.support import paths

pytestmark = pytest.mark.unit
ROOT = paths.ROOT
KNOWN = {f.name for f in dataclasses.fields(Settings) if f.name != "sources"}


def test_a_misspelled_variable_gets_the_closest_setting() -> None:
    env = {
        "STEPWATCH_PARTITON": "3",
        "STEPWATCH_BOOTSTRAP_SERVER": "k:9092",
        "STEPWATCH_KAFKA_SECURITY_PROTOCOL": "SSL",
        "STEPWATCH_ZZZ_QQQ": "1",
        "STEPWATCH_PARTITIONS": "4",
        "STEPWATCH_KAFKA__CLIENT_ID": "x",
        "STEPWATCH_JOB_ID": "42",
        "STEPWATCH_CONFIG": "",
        "PATH": "/bin",
    }
    assert unknown_env(env, KNOWN) == [
        ("STEPWATCH_BOOTSTRAP_SERVER", "STEPWATCH_BOOTSTRAP_SERVERS"),
        ("STEPWATCH_KAFKA_SECURITY_PROTOCOL", "STEPWATCH_KAFKA__SECURITY_PROTOCOL"),
        ("STEPWATCH_PARTITON", "STEPWATCH_PARTITIONS"),
        ("STEPWATCH_ZZZ_QQQ", None),
    ]


def test_load_warns_once_and_still_loads(caplog: pytest.LogCaptureFixture) -> None:
    env = {"STEPWATCH_METRICS_PROT": "9999"}
    with caplog.at_level(logging.WARNING, logger="stepwatch.settings"):
        for _ in range(2):
            settings = Settings.load(env=env)
    hits = [r.getMessage() for r in caplog.records if "STEPWATCH_METRICS_PROT" in r.getMessage()]
    assert hits == [
        "unknown setting ignored env=STEPWATCH_METRICS_PROT did_you_mean=STEPWATCH_METRICS_PORT"
    ]
    assert settings.metrics_port == Settings.load(env={}).metrics_port


def test_every_stepwatch_variable_the_code_reads_is_known() -> None:
    names: set[str] = set()
    for folder in ("stepwatch", "agents", "streams", "exporters", "alerts", "deploy", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and ".venv" not in path.parts:
                names |= set(re.findall(r"STEPWATCH_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    names = {n for n in names if not n.startswith("STEPWATCH_KAFKA")}  # the __ prefix
    assert unknown_env(dict.fromkeys(names, ""), KNOWN) == [], "add it to settings.OTHER_ENV"
    assert not OTHER_ENV - names, "OTHER_ENV names a variable nothing reads"


def test_config_table_groups_every_setting_once_by_service() -> None:
    from stepwatch.cli.config import table

    settings = Settings.load(env={})
    text = table(settings, settings.describe())
    groups = re.findall(r"^\[(.+)\]$", text, re.M)
    assert groups[:2] == ["kafka (every service)", "agent"] and groups[-1] == "every service"
    rows = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert sorted(rows) == sorted(settings.describe()) and len(rows) == len(set(rows))
    remediator = text.split("[remediator]")[1].split("[")[0]
    assert "remediate_port" in remediator and "STEPWATCH_REMEDIATE_PORT" in remediator

    def section(name: str) -> list[str]:
        body = text.split(f"[{name}]\n")[1].split("\n[")[0]
        return [line.split()[0] for line in body.splitlines()]

    # every setting only the agent reads is under it, not under "every service"
    agent = section("agent")
    assert {"agent_socket_group", "agent_verify_job", "agent_sender_rate", "proc_root"} <= set(
        agent
    )
    assert "host_split" in section("stream workers")
    assert not [n for n in section("every service") if n.startswith("agent_")]
