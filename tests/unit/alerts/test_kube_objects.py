"""The prometheus-operator objects (deploy/kubernetes/prometheus-rules.yaml, monitors.yaml):
generated reproducibly, valid against the operator's CRD schemas (vendored under
tests/fixtures/prometheus-operator), and consistent with the rules they serve."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from stepwatch.alerts import kube
from stepwatch.alerts.config import DEFAULT_RUNBOOK_BASE_URL, rule_files
from tests.support import paths
from tests.support.openapi_schema import errors

pytestmark = pytest.mark.unit
CRDS = paths.FIXTURES / "prometheus-operator"
FILES = {
    "PrometheusRule": "prometheusrules",
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
}


def schema(kind: str) -> dict:
    crd = yaml.safe_load((CRDS / f"monitoring.coreos.com_{FILES[kind]}.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == kind
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def shipped() -> list[dict]:
    return [
        d
        for name in (kube.RULES_OUT, kube.MONITORS_OUT)
        for d in yaml.safe_load_all(name.read_text())
        if d
    ]


def test_committed_files_are_what_make_kube_generates(tmp_path: Path) -> None:
    assert kube.main(["kube", "--out", str(tmp_path)]) == 0
    for path in (kube.RULES_OUT, kube.MONITORS_OUT):
        assert (tmp_path / path.name).read_text() == path.read_text(), f"run `make kube`: {path}"


@pytest.mark.parametrize("obj", shipped(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_object_matches_the_operator_crd(obj: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert errors(obj, schema(obj["kind"])) == []


def test_the_check_catches_a_misspelled_field_and_a_wrong_type() -> None:
    rule, monitor = kube.prometheus_rules()[0], kube.monitors()[0]
    bad = copy.deepcopy(rule)
    bad["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    assert any("unknown field" in e for e in errors(bad, schema("PrometheusRule")))
    bad = copy.deepcopy(monitor)
    bad["spec"]["podMetricsEndpoints"][0]["honorLabels"] = "yes"
    assert any("not boolean" in e for e in errors(bad, schema("PodMonitor")))
    bad = copy.deepcopy(monitor)
    del bad["spec"]["selector"]
    assert any("missing selector" in e for e in errors(bad, schema("PodMonitor")))


def test_rules_are_every_shipped_rule_file() -> None:
    objs = kube.prometheus_rules()
    assert [o["metadata"]["name"] for o in objs] == [f"stepwatch-{p.stem}" for p in rule_files()]
    for obj, path in zip(objs, rule_files(), strict=True):
        assert obj["spec"]["groups"] == yaml.safe_load(path.read_text())["groups"]


def test_runbook_urls_are_rebased_on_the_given_url() -> None:
    base = "https://wiki.example.com/sre/stepwatch/runbooks.md"
    urls = [
        r["annotations"]["runbook_url"]
        for o in kube.prometheus_rules(base + "/")
        for g in o["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    assert urls and all(u.startswith(base + "#") for u in urls)
    assert not any(DEFAULT_RUNBOOK_BASE_URL in u for u in urls)


def test_every_scrape_job_the_rules_name_has_a_monitor() -> None:
    wanted = {m for p in rule_files() for m in re.findall(r'job="([\w-]+)"', p.read_text())}
    jobs = {}
    for mon in kube.monitors():
        key = "podMetricsEndpoints" if mon["kind"] == "PodMonitor" else "endpoints"
        for ep in mon["spec"][key]:
            jobs.update(
                {r["replacement"]: ep for r in ep["relabelings"] if r.get("targetLabel") == "job"}
            )
            assert kube.HOST_FROM_HOSTNAME in ep["metricRelabelings"]
    assert wanted <= set(jobs) and wanted
    assert "stepwatch-agent" in jobs and "stepwatch-stream" in jobs and "stepwatch-sink" in jobs
