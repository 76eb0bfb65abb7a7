"""What makes a generated dashboard import anywhere: datasource variables and ``__inputs``,
unique panel ids, links between the dashboards, and annotations from the store.

Panels refer to ``${datasource}`` (Prometheus) and ``${clickhouse}``, two datasource
variables whose default is the ``__inputs`` placeholder ``${DS_PROMETHEUS}`` /
``${DS_CLICKHOUSE}``: Grafana's import dialog asks for both data sources and fills
them in; a provisioned copy (dashboards/provisioning) selects the data source of that
type, and a user switches in the variable's menu. No uid is fixed in the JSON.

Annotations are ClickHouse queries over the store's ``detections``, ``alerts`` and
``remediation_actions`` tables (columns time, timeEnd, text, tags, as the
grafana-clickhouse-datasource plugin reads them).
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    DashboardLink,
    DatasourceVariable,
)
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, VariableOption
from panels import CLICKHOUSE, CLICKHOUSE_TYPE, PROM_TYPE

INPUTS = [
    {
        "name": "DS_PROMETHEUS",
        "label": "Prometheus",
        "description": "stepwatch's Prometheus",
        "type": "datasource",
        "pluginId": PROM_TYPE,
        "pluginName": "Prometheus",
    },
    {
        "name": "DS_CLICKHOUSE",
        "label": "ClickHouse",
        "description": "stepwatch's store",
        "type": "datasource",
        "pluginId": CLICKHOUSE_TYPE,
        "pluginName": "ClickHouse",
    },
]
COLORS = {"Detections": "orange", "Alerts": "red", "Remediation actions": "purple"}


def datasource_variables() -> list[DatasourceVariable]:
    """$datasource (Prometheus) and $clickhouse, defaulting to the __inputs placeholders."""
    out = []
    for name, label, plugin, placeholder in (
        ("datasource", "Prometheus", PROM_TYPE, "${DS_PROMETHEUS}"),
        ("clickhouse", "ClickHouse", CLICKHOUSE_TYPE, "${DS_CLICKHOUSE}"),
    ):
        out.append(
            DatasourceVariable(name)
            .label(label)
            .type(plugin)
            .multi(False)
            .include_all(False)
            .current(VariableOption(selected=False, text=placeholder, value=placeholder))
        )
    return out


def dashboard_links() -> list[Builder[models.DashboardLink]]:
    """A dropdown of every stepwatch dashboard, keeping the time range and variables."""
    return [
        DashboardLink("stepwatch")
        .type(DashboardLinkType.DASHBOARDS)
        .tags(["stepwatch"])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
    ]


class _SqlTarget:
    """An annotation's query for grafana-clickhouse-datasource (the SDK models only the
    built-in annotation target)."""

    def __init__(self, sql: str) -> None:
        self.sql = sql.strip()

    def build(self) -> _SqlTarget:
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "refId": "Anno",
            "editorType": "sql",
            "format": 1,
            "queryType": "table",
            "rawSql": self.sql,
            "datasource": CLICKHOUSE.to_json(),
        }


def annotation_queries(sqls: dict[str, str]) -> list[Builder[models.AnnotationQuery]]:
    return [
        AnnotationQuery()
        .name(name)
        .datasource(CLICKHOUSE)
        .enable(True)
        .icon_color(COLORS[name])
        .target(_SqlTarget(sql))  # type: ignore[arg-type]
        for name, sql in sqls.items()
    ]


def annotation_sql(job_filter: str = "", host_filter: str = "") -> dict[str, str]:
    """The three annotation queries, filtered by a job_id and/or host SQL condition."""

    def where(time_col: str, job_col: str | None, host_col: str) -> str:
        parts = [f"$__timeFilter({time_col})"]
        if job_filter and job_col:
            parts.append(job_filter.replace("{col}", job_col))
        if host_filter:
            parts.append(host_filter.replace("{col}", host_col))
        return " AND ".join(parts)

    return {
        "Detections": f"""
SELECT ts AS time, concat(type, ' (', cause, '): ', summary) AS text,
       arrayFilter(x -> x != '', [type, cause, subject_host, job_id]) AS tags
FROM detections
WHERE {where("ts", "job_id", "subject_host")}
ORDER BY time LIMIT 500""",
        "Alerts": f"""
SELECT starts_at AS time, ifNull(ends_at, starts_at) AS timeEnd,
       concat(alertname, ' [', severity, '] ', annotations['summary']) AS text,
       arrayFilter(x -> x != '', [alertname, severity, host, job_id]) AS tags
FROM alerts
WHERE status = 'firing' AND {where("starts_at", "job_id", "host")}
ORDER BY time LIMIT 500""",
        "Remediation actions": f"""
SELECT ts AS time, concat(action, ' ', host, ' (', status, if(dry_run, ', dry run', ''), '): ',
       reason) AS text, arrayFilter(x -> x != '', [action, status, host, job_id]) AS tags
FROM remediation_actions
WHERE {where("ts", "job_id", "host")}
ORDER BY time LIMIT 500""",
    }


def finish(dash: dict[str, Any]) -> dict[str, Any]:
    """``dash`` (the SDK's built dashboard as JSON) with panel ids and ``__inputs``, in place."""
    _number_panels(dash)
    text = json.dumps(dash)
    dash["__inputs"] = [i for i in INPUTS if "${" + i["name"] + "}" in text]
    dash["__requires"] = [
        {"type": "datasource", "id": i["pluginId"], "name": i["pluginName"], "version": ""}
        for i in dash["__inputs"]
    ]
    return dash


def _number_panels(dash: dict[str, Any]) -> None:
    n = 0
    for panel in dash.get("panels") or []:
        n += 1
        panel["id"] = n
        for inner in panel.get("panels") or []:
            n += 1
            inner["id"] = n
