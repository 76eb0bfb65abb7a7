"""Every dashboard query runs and returns data: PromQL against a real Prometheus that
scraped a simulated run's real metrics, SQL on the embedded ClickHouse engine over a
simulated run loaded by the sink's own row mapping.

Panels marked fault-only (their series exist only while something fires, or in the
remediator's process, which is not started here) are checked for a valid query:
Prometheus accepts and evaluates them. They are: Fleet overview "Firing alerts" (table),
Pipeline health "Remediator decisions", "Circuit breaker open", "Actuator errors".
"""

from __future__ import annotations

import re

import pytest

from stepwatch.daemons.prometheus import wait_for
from tests.support import dash_metrics as M
from tests.support import sim_store
from tests.support.dashboard_support import (
    annotations,
    dashboards,
    queries,
    substitute_promql,
    substitute_sql,
)

pytestmark = pytest.mark.integration
pytest.importorskip("grafana_foundation_sdk")

# $cluster is All (.*): the test's Prometheus adds no cluster label, as a single-cluster one
PROM_VALUES = {"job_id": M.JOB, "host": M.HOST, "gpu": "2", "cluster": ".*"}
SQL_VALUES = {"job_id": sim_store.JOB, "host": "node0001", "gpu": "0"}


def _add_alert_and_action(path) -> None:
    """One firing alert and one remediation action in the store, as the alert sink and the
    remediator's audit write them, for the annotation queries."""
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    t0 = sim_store.scenario().start_ts + 30
    s = ChdbStore(str(path))
    try:
        s.query(f"""INSERT INTO alerts (received_at, fingerprint, alertname, status, severity,
            starts_at, job_id, host, labels, annotations) VALUES (fromUnixTimestamp64Milli(
            {int(t0 * 1000)}), 'f1', 'StragglerPersistent', 'firing', 'critical',
            fromUnixTimestamp64Milli({int(t0 * 1000)}), '{sim_store.JOB}', 'node0001',
            map('cause', 'gpu'), map('summary', 'rank 13 is a straggler'))""")
        s.query(f"""INSERT INTO remediation_actions (ts, id, action, status, dry_run, job_id, host,
            detection_id, alert_fingerprint, reason, detail, actor) VALUES (
            fromUnixTimestamp64Milli({int(t0 * 1000) + 5000}), 'a1', 'drain', 'recorded', true,
            '{sim_store.JOB}', 'node0001', '', 'f1', 'StragglerPersistent', '', 'remediator')""")
    finally:
        s.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    path = tmp_path_factory.mktemp("dash") / "chdb"
    sim_store.fill(path)
    _add_alert_and_action(path)
    s = ChdbStore(str(path), readonly=True)
    yield s
    s.close()


def test_every_clickhouse_panel_returns_rows(store) -> None:
    sc = sim_store.scenario()
    start, end = sc.start_ts - 60, sc.start_ts + 3600
    checked = 0
    for q in queries():
        if q.kind != "clickhouse":
            continue
        sql = substitute_sql(q.text, SQL_VALUES, start, end)
        assert not re.search(r"\$\{|\$__", sql), f"{q.dashboard}/{q.panel}: unsubstituted {sql}"
        result = store.query(sql)
        assert result.rows, f"{q.dashboard}/{q.panel} returned no rows"
        checked += 1
    assert checked >= 6


def test_every_annotation_query_returns_time_and_text(store) -> None:
    sc = sim_store.scenario()
    start, end = sc.start_ts - 60, sc.start_ts + 3600
    checked = 0
    for q in annotations():
        sql = substitute_sql(q.text, SQL_VALUES, start, end)
        assert not re.search(r"\$\{|\$__", sql), f"{q.dashboard}/{q.panel}: unsubstituted {sql}"
        result = store.query(sql)
        assert result.rows, f"{q.dashboard}/{q.panel} annotation returned no rows"
        assert {"time", "text", "tags"} <= set(result.columns), result.columns
        checked += 1
    assert checked == 15


# names a sender may choose (the contract allows quotes, backslashes, `$`, `%`, braces)
HOSTILE = {
    "job_id": "j' OR job_id != 'x\\",
    "host": "n'1\\$$%{}|.*é",
    "gpu": "0",
}
TABLES = (
    "step_events",
    "detections",
    "gpu_samples",
    "port_samples",
    "alerts",
    "remediation_actions",
)


def _copy(store, database: str, names: dict[str, str]) -> None:
    """The run's tables in ``database``, its job and host renamed as ``names`` says."""
    store.command(f"CREATE DATABASE {database}")
    renames = {
        "job_id": (sim_store.JOB, "job"),
        "host": ("node0001", "host"),
        "subject_host": ("node0001", "host"),
    }
    for table in TABLES:
        store.command(f"CREATE TABLE {database}.{table} AS stepwatch.{table}")
        cols = set(store.query(f"SELECT * FROM stepwatch.{table} LIMIT 0").columns)
        replace = ", ".join(
            f"if({c} = '{old}', {{{param}:String}}, {c}) AS {c}"
            for c, (old, param) in renames.items()
            if c in cols
        )
        store.command(
            f"INSERT INTO {database}.{table} SELECT * REPLACE ({replace}) FROM stepwatch.{table}",
            {"job": names["job_id"], "host": names["host"]},
        )


def test_hostile_job_ids_and_host_names_select_their_own_rows_and_no_others(store) -> None:
    """A variable's value goes into SQL as Grafana formats it. Before, the job drill-down
    wrote ``job_id = '${job_id}'`` and the others ``'^(${host:regex})$'``: a job id or host
    name with a quote ended the literal (the query failed, or said what the sender wrote:
    ``j' OR job_id != 'x`` listed every other job), and one with a backslash matched
    nothing. The same run stored once under the hostile names and once under plain ones:
    each query finds the first and not the second."""
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    sc = sim_store.scenario()
    start, end = sc.start_ts - 60, sc.start_ts + 3600
    writer = ChdbStore(store.path)  # the module's store, its run copied into two databases
    try:
        _copy(writer, "hostile", HOSTILE)
        _copy(writer, "plain", {"job_id": "other-job", "host": "other-host"})
        checked = 0
        for q in [*queries(), *annotations()]:
            if q.kind != "clickhouse" or not re.search(r"\$\{(job_id|host)", q.text):
                continue
            sql = substitute_sql(q.text, HOSTILE, start, end)
            writer.command("USE hostile")
            assert writer.query(sql).rows, f"{q.dashboard}/{q.panel}: no rows of its own"
            writer.command("USE plain")
            assert not writer.query(sql).rows, f"{q.dashboard}/{q.panel}: another's rows"
            checked += 1
        assert checked == 18
    finally:
        writer.close()


def test_every_prometheus_panel_returns_data(tmp_path, prometheus_factory) -> None:
    served = M.serve_all(str(tmp_path / "spool"))
    try:
        prom = prometheus_factory(
            scrape_jobs={job: [t] for job, t in served.targets.items()}, targets=[]
        )
        # rate() over 30 s needs a few scrapes of every target
        wait_for(
            lambda: all(v >= 4 for v in _scrapes(prom)), 60, what="four scrapes of each target"
        )
        empty, checked = [], 0
        for q in queries():
            if q.kind != "prometheus":
                continue
            expr = substitute_promql(q.text, PROM_VALUES)
            assert "$" not in expr, f"{q.dashboard}/{q.panel}: unsubstituted {expr}"
            samples = prom.query(expr)  # a bad expression raises
            checked += 1
            if not samples and not q.fault_only:
                empty.append(f"{q.dashboard}/{q.panel}: {expr}")
        assert not empty, "panels without data:\n" + "\n".join(empty)
        assert checked >= 40
        for name, dash in dashboards().items():  # template variables list their values
            for var in dash.get("templating", {}).get("list", []):
                if var["type"] != "query":
                    continue
                metric, label = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]).groups()
                metric = substitute_promql(metric, PROM_VALUES)
                got = {s.labels.get(label) for s in prom.query(f"group by ({label}) ({metric})")}
                if label == "cluster":  # only where Prometheus adds one; All (.*) matches none
                    assert got <= {None}, got
                    continue
                assert got & {M.JOB, M.HOST, PROM_VALUES["gpu"]}, (
                    f"{name}: ${var['name']} lists {got}"
                )
    finally:
        served.close()


def _scrapes(prom) -> list[float]:
    got = prom.query("count_over_time(up[1m])")
    return [s.value for s in got] if len(got) >= 3 else [0.0]


def test_fault_only_panels_are_the_documented_ones() -> None:
    marked = sorted({f"{q.dashboard}/{q.panel}" for q in queries() if q.fault_only})
    assert marked == [
        "fleet-overview/Firing alerts",
        "pipeline-health/Actuator errors",
        "pipeline-health/Circuit breaker open",
        "pipeline-health/Remediator decisions",
    ]
