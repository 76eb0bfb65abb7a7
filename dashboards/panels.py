"""Panel helpers over grafana-foundation-sdk: every panel gets a unit and a data source.

Prometheus panels use the SDK's Prometheus query builder; ClickHouse panels use
:class:`ClickHouseQuery`, the query model of the grafana-clickhouse-datasource
plugin (v4), which the SDK has no builder for.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.dashboard import DashboardLink
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models.dashboard import DataSourceRef
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

PROM_TYPE, CLICKHOUSE_TYPE = "prometheus", "grafana-clickhouse-datasource"
#: Panels name their data source through the dashboard's datasource variables
#: ($datasource, $clickhouse: portable.py), never a fixed uid, so the JSON imports anywhere.
PROM = DataSourceRef(type_val=PROM_TYPE, uid="${datasource}")
CLICKHOUSE = DataSourceRef(type_val=CLICKHOUSE_TYPE, uid="${clickhouse}")
#: Panels whose series exist only while a fault fires (or in another service's build):
#: the dashboard test checks them for a valid query instead of data. Marked in the JSON.
FAULT_ONLY_TAG = "stepwatch:fault-only"


class ClickHouseQuery(cogvariants.Dataquery):
    def __init__(self, sql: str, ref_id: str = "A", fmt: int = 0) -> None:
        self.sql, self.ref_id, self.fmt = sql.strip(), ref_id, fmt

    def to_json(self) -> dict[str, Any]:
        # format: 0 time series, 1 table (grafana-clickhouse-datasource's Format enum)
        return {
            "refId": self.ref_id,
            "datasource": CLICKHOUSE.to_json(),
            "editorType": "sql",
            "queryType": "table" if self.fmt == 1 else "timeseries",
            "format": self.fmt,
            "rawSql": self.sql,
            "pluginVersion": "4.0.0",
        }


class ClickHouseQueryBuilder:
    """A cog builder for :class:`ClickHouseQuery` (what ``with_target`` takes)."""

    def __init__(self, sql: str, *, fmt: int = 0) -> None:
        self._q = ClickHouseQuery(sql, fmt=fmt)

    def build(self) -> ClickHouseQuery:
        return self._q


def prom(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref)
    return q.legend_format(legend) if legend else q


def series(
    title: str,
    unit: str,
    *exprs: tuple[str, str],
    w: int = 12,
    h: int = 8,
    desc: str = "",
    fault_only: bool = False,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(PROM)
        .span(w)
        .height(h)
        .description(_desc(desc, fault_only))
    )
    for i, (expr, legend) in enumerate(exprs):
        p = p.with_target(prom(expr, legend, chr(ord("A") + i)))
    return p


def single(
    title: str,
    unit: str,
    expr: str,
    legend: str = "",
    w: int = 6,
    h: int = 4,
    desc: str = "",
    fault_only: bool = False,
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .datasource(PROM)
        .span(w)
        .height(h)
        .description(_desc(desc, fault_only))
        .with_target(prom(expr, legend))
    )


def prom_table(
    title: str,
    unit: str,
    expr: str,
    w: int = 12,
    h: int = 8,
    desc: str = "",
    fault_only: bool = False,
    links: dict[str, str] | None = None,
) -> table.Panel:
    """An instant table; ``links``: title -> URL of a data link on every cell
    (``${__data.fields.X}``)."""
    q = prom(expr).instant().format(PromQueryFormat.TABLE)
    p = (
        table.Panel()
        .title(title)
        .unit(unit)
        .datasource(PROM)
        .span(w)
        .height(h)
        .description(_desc(desc, fault_only))
        .with_target(q)
    )
    if links:
        p = p.data_links([DashboardLink(name).url(url) for name, url in links.items()])
    return p


def ch_series(
    title: str, unit: str, sql: str, w: int = 12, h: int = 8, desc: str = ""
) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(CLICKHOUSE)
        .span(w)
        .height(h)
        .description(desc)
        .with_target(ClickHouseQueryBuilder(sql))  # type: ignore[arg-type]
    )


def ch_table(
    title: str, unit: str, sql: str, w: int = 24, h: int = 8, desc: str = ""
) -> table.Panel:
    return (
        table.Panel()
        .title(title)
        .unit(unit)
        .datasource(CLICKHOUSE)
        .span(w)
        .height(h)
        .description(desc)
        .with_target(ClickHouseQueryBuilder(sql, fmt=1))  # type: ignore[arg-type]
    )


def ch_heatmap(
    title: str, unit: str, sql: str, w: int = 24, h: int = 10, desc: str = ""
) -> heatmap_b.Panel:
    return (
        heatmap_b.Panel()
        .title(title)
        .unit(unit)
        .datasource(CLICKHOUSE)
        .span(w)
        .height(h)
        .description(desc)
        .with_target(ClickHouseQueryBuilder(sql, fmt=1))  # type: ignore[arg-type]
    )


def _desc(text: str, fault_only: bool) -> str:
    return f"{text} [{FAULT_ONLY_TAG}]".strip() if fault_only else text
