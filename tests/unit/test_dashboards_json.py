"""The generated Grafana dashboards: up to date, valid for the schema they declare, units set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dashboard_support import CH_UID, JSON_DIR, PROM_UID, ROOT, dashboards, panels, queries

pytestmark = pytest.mark.unit
sdk = pytest.importorskip("grafana_foundation_sdk")

WANTED = {"fleet-overview", "job-drilldown", "node-gpu-health", "network-fabric", "pipeline-health"}


def test_committed_json_is_what_the_code_generates() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert set(dashboards()) == WANTED


@pytest.mark.parametrize("name", sorted(WANTED))
def test_dashboard_matches_its_declared_schema_version(name: str) -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = json.loads((JSON_DIR / f"{name}.json").read_text())
    assert raw["schemaVersion"] == Dashboard().schema_version == 36
    # the SDK's model of schema 36 reads it back to the same document
    again = json.loads(json.dumps(Dashboard.from_json(raw), cls=JSONEncoder))
    assert _drop_none(again) == _drop_none(raw)
    assert raw["uid"].startswith("stepwatch-") and raw["title"].startswith("stepwatch / ")
    for var in raw.get("templating", {}).get("list", []):
        assert var["type"] == "query" and var["datasource"]["uid"] == PROM_UID


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
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in "hwxy") and 0 < pos["w"] <= 24, where
        targets = panel["targets"]
        assert targets and len({t["refId"] for t in targets}) == len(targets), where
    assert seen >= 6


def test_clickhouse_and_prometheus_panels_exist_where_the_issue_wants_them() -> None:
    kinds = {(q.dashboard, q.kind) for q in queries()}
    assert ("job-drilldown", "clickhouse") in kinds and ("job-drilldown", "prometheus") in kinds
    titles = {q.panel for q in queries()}
    for wanted in ("XID events", "ECC errors", "NVLink traffic (ClickHouse)", "PCIe replays",
                   "Transmit wait (congestion)", "Agent spool", "Stream consumer lag",
                   "Dead letters", "Rows inserted", "Circuit breaker open",
                   "Compute time per rank (ClickHouse)", "MFU", "Goodput", "Stragglers"):
        assert wanted in titles


def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
