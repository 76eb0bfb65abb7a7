"""Read the generated dashboards: panels, their queries, template substitution."""

import json
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support import paths

ROOT = paths.ROOT
JSON_DIR = ROOT / "dashboards" / "json"
FAULT_ONLY = "stepwatch:fault-only"
PROM_TYPE, CH_TYPE = "prometheus", "grafana-clickhouse-datasource"
# panels name their data source through these datasource variables, never a fixed uid
PROM_UID, CH_UID = "${datasource}", "${clickhouse}"


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    kind: str  # "prometheus" | "clickhouse"
    text: str
    fault_only: bool


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


def panels(dash: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels") or []


def queries() -> Iterator[Query]:
    for name, dash in dashboards().items():
        for panel in panels(dash):
            for target in panel.get("targets") or []:
                kind = (target.get("datasource") or panel["datasource"])["type"]
                text = target.get("expr") if kind == PROM_TYPE else target.get("rawSql")
                yield Query(
                    name,
                    panel["title"],
                    "prometheus" if kind == PROM_TYPE else "clickhouse",
                    text,
                    FAULT_ONLY in (panel.get("description") or ""),
                )


def annotations() -> Iterator[Query]:
    """The ClickHouse annotation queries of every dashboard."""
    for name, dash in dashboards().items():
        for anno in dash.get("annotations", {}).get("list", []):
            if anno.get("builtIn"):
                continue
            yield Query(name, anno["name"], "clickhouse", anno["target"]["rawSql"], False)


def substitute_promql(expr: str, values: Mapping[str, str]) -> str:
    out = expr.replace("$__rate_interval", "30s").replace("$__range", "5m")
    for name, value in values.items():
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    return out


def substitute_sql(sql: str, values: Mapping[str, str], start: float, end: float) -> str:
    """The grafana-clickhouse-datasource macros and variables, as the plugin expands them."""
    out = re.sub(
        r"\$__timeFilter\((\w+)\)",
        lambda m: (
            f"{m.group(1)} >= toDateTime({int(start)}) AND {m.group(1)} <= toDateTime({int(end)})"
        ),
        sql,
    )
    for name, value in values.items():
        for fmt, formatted in grafana_formats(value).items():
            out = out.replace("${" + name + (f":{fmt}" if fmt else "") + "}", formatted)
    return out


def grafana_formats(value: str) -> dict[str, str]:
    """A single value as Grafana formats it: ``${x:regex}`` (its escapeRegex: ``'`` stays
    as it is), ``${x:percentencode}`` (encodeURIComponent, plus ``!'()*``) and
    ``${x}`` (grafana-clickhouse-datasource puts a single value in as it is)."""
    return {
        "regex": re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m.group(0), value),
        "percentencode": urllib.parse.quote(value, safe="-_.~"),
        "": value,
    }
