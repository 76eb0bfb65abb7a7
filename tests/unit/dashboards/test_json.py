"""The generated Grafana dashboards: up to date, valid for the schema they declare, units set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.dashboard_support import (
    CH_TYPE,
    CH_UID,
    JSON_DIR,
    PROM_TYPE,
    PROM_UID,
    ROOT,
    dashboards,
    panels,
    queries,
)

pytestmark = pytest.mark.unit
sdk = pytest.importorskip("grafana_foundation_sdk")

WANTED = {"fleet-overview", "job-drilldown", "node-gpu-health", "network-fabric", "pipeline-health"}


def test_committed_json_is_what_the_code_generates() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert set(dashboards()) == WANTED


@pytest.mark.parametrize("name", sorted(WANTED))
def test_dashboard_matches_its_declared_schema_version(name: str) -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = json.loads((JSON_DIR / f"{name}.json").read_text())
    assert raw["schemaVersion"] == Dashboard().schema_version == 36
    # the SDK's model of schema 36 reads it back to the same document, except what the model
    # does not carry: the export format's __inputs/__requires and the annotation queries'
    # data source targets (its AnnotationTarget is the built-in one's)
    schema = {k: v for k, v in raw.items() if k not in ("__inputs", "__requires")}
    again = json.loads(json.dumps(Dashboard.from_json(schema), cls=JSONEncoder))
    for anno in schema["annotations"]["list"] + again["annotations"]["list"]:
        anno.pop("target", None)
    assert _drop_none(again) == _drop_none(schema)
    assert raw["uid"].startswith("stepwatch-") and raw["title"].startswith("stepwatch / ")
    for var in raw.get("templating", {}).get("list", []):
        if var["type"] == "datasource":
            assert var["query"] in (PROM_TYPE, CH_TYPE)
        else:
            assert var["type"] == "query" and var["datasource"]["uid"] == PROM_UID
            assert var["refresh"] == 2, "options are loaded, not frozen in the JSON"


@pytest.mark.parametrize("name", sorted(WANTED))
def test_every_panel_has_a_unit_a_known_data_source_a_place_and_queries(name: str) -> None:
    dash = dashboards()[name]
    seen = 0
    for panel in panels(dash):
        if panel["type"] == "row":
            continue
        seen += 1
        where = f"{name}: {panel['title']}"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert panel["datasource"]["uid"] in (PROM_UID, CH_UID), where
        for target in panel["targets"]:
            if "$__range" in (target.get("expr") or ""):
                assert panel["type"] != "timeseries", f"{where}: a window per point, not the range"
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in "hwxy") and 0 < pos["w"] <= 24, where
        targets = panel["targets"]
        assert targets and len({t["refId"] for t in targets}) == len(targets), where
    assert seen >= 6


def test_clickhouse_and_prometheus_panels_exist_where_the_issue_wants_them() -> None:
    kinds = {(q.dashboard, q.kind) for q in queries()}
    assert ("job-drilldown", "clickhouse") in kinds and ("job-drilldown", "prometheus") in kinds
    titles = {q.panel for q in queries()}
    for wanted in (
        "XID events",
        "ECC errors",
        "NVLink traffic (ClickHouse)",
        "PCIe replays",
        "Framebuffer used (ClickHouse)",
        "Fleet GPU power",
        "Agents up",
        "Transmit wait (congestion)",
        "Agent spool",
        "Stream consumer lag",
        "Dead letters",
        "Rows inserted",
        "Circuit breaker open",
        "Compute time per rank (ClickHouse)",
        "MFU",
        "Goodput",
        "Stragglers",
    ):
        assert wanted in titles


@pytest.mark.parametrize("name", sorted(WANTED))
def test_panel_ids_are_unique_and_set(name: str) -> None:
    ids = [p["id"] for p in panels(dashboards()[name])]
    assert all(isinstance(i, int) and i > 0 for i in ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize("name", sorted(WANTED))
def test_every_dashboard_has_the_variables_users_expect(name: str) -> None:
    names = [v["name"] for v in dashboards()[name]["templating"]["list"]]
    assert names[:2] == ["datasource", "clickhouse"] and "cluster" in names
    wanted = {
        "fleet-overview": {"job_id"},
        "job-drilldown": {"job_id"},
        "node-gpu-health": {"host", "gpu"},
        "network-fabric": {"host"},
    }.get(name, set())
    assert wanted <= set(names)
    for q in queries():
        if q.dashboard == name and q.kind == "prometheus":
            assert 'cluster=~"$cluster"' in q.text, f"{q.panel}: {q.text}"


def _import(dash: dict, uids: dict[str, str]) -> dict:
    """What Grafana's import dialog does: every ${DS_X} of __inputs becomes the chosen uid."""
    text = json.dumps(dash)
    for item in dash["__inputs"]:
        text = text.replace("${" + item["name"] + "}", uids[item["pluginId"]])
    return json.loads(text)


@pytest.mark.parametrize("name", sorted(WANTED))
def test_import_with_other_datasource_uids_resolves_every_panel(name: str) -> None:
    dash = dashboards()[name]
    text = json.dumps(dash)
    assert "stepwatch-prometheus" not in text and "stepwatch-clickhouse" not in text, "fixed uid"
    uids = {PROM_TYPE: "P1809F7CD0C75ACF3", CH_TYPE: "ch-other-7"}
    done = _import(dash, uids)
    assert "${DS_" not in json.dumps(done), "a placeholder without an __inputs entry"
    chosen = {
        v["name"]: v["current"]["value"]
        for v in done["templating"]["list"]
        if v["type"] == "datasource"
    }
    assert chosen == {"datasource": uids[PROM_TYPE], "clickhouse": uids[CH_TYPE]}
    kinds = {v["name"]: v["query"] for v in done["templating"]["list"] if v["type"] == "datasource"}
    refs = [p["datasource"] for p in panels(done) if p["type"] != "row"]
    refs += [
        t["datasource"] for p in panels(done) for t in p.get("targets") or [] if "datasource" in t
    ]
    refs += [a["datasource"] for a in done["annotations"]["list"] if not a.get("builtIn")]
    refs += [v["datasource"] for v in done["templating"]["list"] if v["type"] == "query"]
    for ref in refs:
        var = ref["uid"].strip("${}")
        assert ref["uid"] in (PROM_UID, CH_UID) and kinds[var] == ref["type"], ref
    assert {i["pluginId"] for i in done["__inputs"]} == {kinds[r["uid"].strip("${}")] for r in refs}


def test_dashboards_link_to_each_other_and_flagged_ranks_to_the_job() -> None:
    for name, dash in dashboards().items():
        assert any(
            link["type"] == "dashboards" and "stepwatch" in link["tags"] for link in dash["links"]
        ), name
    fleet = {p["title"]: p for p in panels(dashboards()["fleet-overview"])}
    urls = [
        link["url"]
        for link in fleet["Flagged ranks (score = relative slowdown)"]["fieldConfig"]["defaults"][
            "links"
        ]
    ]
    job_uid = dashboards()["job-drilldown"]["uid"]
    assert any(
        u.startswith(f"/d/{job_uid}/") and "var-job_id=${__data.fields.job_id:percentencode}" in u
        for u in urls
    )


def test_annotations_cover_detections_alerts_and_actions() -> None:
    for name, dash in dashboards().items():
        annos = {a["name"]: a for a in dash["annotations"]["list"] if not a.get("builtIn")}
        assert set(annos) == {"Detections", "Alerts", "Remediation actions"}, name
        tables = {
            "Detections": "detections",
            "Alerts": "alerts",
            "Remediation actions": "remediation_actions",
        }
        for title, anno in annos.items():
            sql = anno["target"]["rawSql"]
            assert f"FROM {tables[title]}" in sql and " AS time" in sql and " AS text" in sql


def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
