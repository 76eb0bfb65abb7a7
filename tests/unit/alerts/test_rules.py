"""The Prometheus alert rules: promtool accepts them, unit tests cover every one, labels and
annotations are complete and every runbook link lands on a section of docs/runbooks.md."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from stepwatch.alerts.config import DEFAULT_RUNBOOK_BASE_URL, rule_files, rule_test_files
from tests.support import paths

ROOT = paths.ROOT
RUNBOOKS = ROOT / "docs" / "runbooks.md"
# monitoring-mixins / kube-prometheus severities
SEVERITIES = {"critical", "warning", "info"}
CLASSES = {"system", "user"}
REMEDIATIONS = {"drain", "requeue", "notify", "none"}
SCOPES = {"node", "gpu", "port", "rank", "job", "pipeline"}

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)"
)


def alerting_rules() -> list[dict]:
    return [
        r
        for f in rule_files()
        for g in yaml.safe_load(f.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    ]


def recording_rules() -> list[dict]:
    return [
        r
        for f in rule_files()
        for g in yaml.safe_load(f.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    ]


def templated_values(value: str) -> set[str]:
    """The values a label template can produce (literal text between the actions)."""
    if "{{" not in value:
        return {value}
    return {v for v in re.findall(r"}}([^{]+){{", value) if v.strip()}


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@needs_promtool
def test_promtool_accepts_every_rule_file() -> None:
    result = run("promtool", "check", "rules", *map(str, rule_files()))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = run("promtool", "test", "rules", *map(str, rule_test_files()))
    assert result.returncode == 0, result.stdout + result.stderr


# docs/alerts.md, "Prometheus setup": the scrape jobs the rules expect
SCRAPE_JOBS = ("stepwatch-agent", "stepwatch-stream", "stepwatch-sink", "stepwatch-remediator")


@pytest.mark.parametrize("job", SCRAPE_JOBS)
def test_every_scraped_component_has_a_down_alert(job: str) -> None:
    """A dead component's own series go stale, so only ``up`` can tell: each has an alert
    on ``up{job=...} == 0`` (a dead sink was silent: SinkBehind reads the sink's series)."""
    selector = re.compile(r'up\{[^}]*job="' + re.escape(job) + r'"[^}]*\}')
    down = [
        r["alert"]
        for r in alerting_rules()
        if selector.search(r["expr"]) and re.search(r"==\s*0", r["expr"])
    ]
    assert down, f"no alert fires when the {job} target is down"
    assert f"`{job}`" in RUNBOOKS.with_name("alerts.md").read_text()


def test_every_rule_is_exercised_firing_and_quiet() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    exprs: set[str] = set()
    for f in rule_test_files():
        for test in yaml.safe_load(f.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                expected = case.get("exp_alerts") or []
                if expected:
                    fired.add(case["alertname"])
                if not expected or _has_quiet_series(test, expected):
                    quiet.add(case["alertname"])
            exprs.update(c["expr"].split("{")[0] for c in test.get("promql_expr_test", []))
    names = {r["alert"] for r in alerting_rules()}
    assert names - fired == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested staying quiet"
    assert {r["record"] for r in recording_rules()} <= exprs


def _has_quiet_series(test: dict, expected: list) -> bool:
    """More input series than alerts expected: some series must not fire."""
    return len(test["input_series"]) > len(expected) + _support_series(test)


def _support_series(test: dict) -> int:
    """Series that feed an alert without being alerts themselves (agent liveness, spool size)."""
    support = (
        "process_start_time_seconds",
        "stepwatch_agent_up",
        "stepwatch_agent_spool_bytes",
        "stepwatch_sink_last_commit_timestamp_seconds",
    )
    return sum(1 for s in test["input_series"] if s["series"].startswith(support))


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: r["alert"])
def test_rule_labels_and_annotations(rule: dict) -> None:
    labels, notes = rule["labels"], rule["annotations"]
    assert templated_values(labels["severity"]) <= SEVERITIES
    assert templated_values(labels["class"]) <= CLASSES
    assert templated_values(labels["remediation"]) <= REMEDIATIONS
    assert labels["scope"] in SCOPES
    assert notes["summary"] and "{{" in notes["description"], "description must carry values"
    if labels["class"] == "user":
        assert labels["remediation"] in {"notify", "none"}, "user errors are never remediated"


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: r["alert"])
def test_an_alert_that_may_act_is_critical(rule: dict) -> None:
    """A person hears at once of anything the remediator may do (drain, requeue): the
    severity follows the remediation label, branch by branch where both are templated."""
    labels = rule["labels"]
    severity, remediation = labels["severity"], labels["remediation"]
    if "{{" in severity:
        assert severity.replace("critical", "drain").replace("warning", "notify") == remediation
    elif templated_values(remediation) & {"drain", "requeue"}:
        assert severity == "critical"


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: r["alert"])
def test_runbook_url_is_a_section_of_the_runbooks(rule: dict) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith("https://"), "monitoring-mixins: runbook_url is absolute"
    assert url == f"{DEFAULT_RUNBOOK_BASE_URL}#{rule['alert'].lower()}"
    headings = {
        _anchor(line) for line in RUNBOOKS.read_text().splitlines() if line.startswith("### ")
    }
    assert url.split("#", 1)[1] in headings


def _anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-")
