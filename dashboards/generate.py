"""Generate stepwatch's Grafana dashboards (JSON under dashboards/json/).

    python dashboards/generate.py          # write the JSON files
    python dashboards/generate.py --check  # fail when a committed file is stale

Dashboards as code with grafana-foundation-sdk (pinned in pyproject's
``dashboards`` extra); ``make dashboards`` runs this. Panels use the ``$datasource``
(Prometheus) and ``$clickhouse`` variables with ``__inputs`` for the import dialog
(portable.py): no data source uid is fixed. Every Prometheus selector carries
``cluster=~"$cluster"`` (empty where Prometheus adds no cluster label: All matches).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import VariableRefresh, VariableSort
from panels import (
    PROM,
    ch_heatmap,
    ch_series,
    ch_table,
    prom_table,
    series,
    single,
)
from portable import (
    annotation_queries,
    annotation_sql,
    dashboard_links,
    datasource_variables,
    finish,
)

OUT = Path(__file__).resolve().parent / "json"
RATE = "$__rate_interval"
C = 'cluster=~"$cluster"'
JOB = f'job_id=~"$job_id", {C}'
GPU_HOST = f'host=~"$host", gpu=~"$gpu", {C}'
HOST = f'host=~"$host", {C}'
GPU = "{{host}} gpu{{gpu}}"
JOB_LINK = "/d/stepwatch-job/?var-job_id=${__data.fields.job_id:percentencode}&${__url_time_range}"
NODE_LINK = "/d/stepwatch-node/?var-host=${__data.fields.host:percentencode}&${__url_time_range}"

# Variables in ClickHouse SQL. Job ids and host names are the senders' (a quote, a backslash,
# `$$`): Grafana's regex format escapes `$` but neither `'` nor `\`, and the plugin puts a
# plain `${x}` in as it is, so `'${job_id}'` let a job id end the literal. A regex goes in a
# heredoc (`$$...$$`: no escapes read, and it cannot close it); one value percent-encoded.


def sql_regex(var: str) -> str:
    """The SQL string literal of the anchored regex ``^(values)$`` of a variable."""
    return f"concat('^(', $$${{{var}:regex}}$$, ')$')"


def sql_value(var: str) -> str:
    """The SQL string literal of a single-valued variable's value."""
    return f"decodeURLComponent('${{{var}:percentencode}}')"


CLUSTER_QUERY = 'label_values(up{job=~"stepwatch-.*"}, cluster)'

# Annotations (detections, alerts, remediation actions) filtered to what each dashboard shows,
# by dashboard uid.
JOBS_RE, HOSTS_RE = f"match({{col}}, {sql_regex('job_id')})", f"match({{col}}, {sql_regex('host')})"
ANNOTATIONS: dict[str, dict[str, str]] = {
    "stepwatch-fleet": annotation_sql(job_filter=JOBS_RE),
    "stepwatch-job": annotation_sql(job_filter=f"{{col}} = {sql_value('job_id')}"),
    "stepwatch-node": annotation_sql(host_filter=HOSTS_RE),
    "stepwatch-network": annotation_sql(host_filter=HOSTS_RE),
    "stepwatch-pipeline": annotation_sql(),
}


def _var(name: str, query: str, label: str, *, multi: bool = True) -> QueryVariable:
    """A variable from Prometheus labels; multi-value ones have All = ``.*`` (regex matchers)."""
    v = (
        QueryVariable(name)
        .label(label)
        .datasource(PROM)
        .query(query)
        .multi(multi)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NUMERICAL_ASC)
    )
    return v.include_all(True).all_value(".*") if multi else v


def _base(uid: str, title: str, *tags: str) -> Dashboard:
    dash = (
        Dashboard(title)
        .uid(uid)
        .tags(["stepwatch", *tags])
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("utc")
        .links(dashboard_links())
        .annotations(annotation_queries(ANNOTATIONS[uid]))
    )
    for var in datasource_variables():
        dash = dash.with_variable(var)
    return dash.with_variable(_var("cluster", CLUSTER_QUERY, "cluster"))


def fleet() -> Dashboard:
    agents = f'up{{job="stepwatch-agent", {C}}}'
    return (
        _base("stepwatch-fleet", "stepwatch / Fleet overview", "fleet")
        .with_variable(
            _var("job_id", f"label_values(stepwatch_job_step_seconds{{{C}}}, job_id)", "job")
        )
        .with_row(Row("Jobs"))
        .with_panel(single("Jobs analysed", "short", f"sum(stepwatch_stream_jobs{{{C}}})", w=4))
        .with_panel(
            single(
                "Agents up",
                "short",
                f"count({agents} == 1) or vector(0)",
                w=4,
                desc="Agents Prometheus scraped at the last scrape (up == 1).",
            )
        )
        .with_panel(
            single(
                "Agents down",
                "short",
                f"count({agents} == 0) or vector(0)",
                w=4,
                desc="Agent targets Prometheus could not scrape (up == 0).",
            )
        )
        .with_panel(
            single(
                "Open detections",
                "short",
                f"sum(stepwatch_job_open_detections{{{JOB}}}) or vector(0)",
                w=4,
            )
        )
        .with_panel(
            single(
                "Firing alerts",
                "short",
                f'count(ALERTS{{alertstate="firing", {C}}}) or vector(0)',
                w=4,
                desc="Alert rules (alerts/src/stepwatch/alerts/rules) currently firing.",
            )
        )
        .with_panel(
            single(
                "Fleet GPU power",
                "watt",
                f"sum(stepwatch_gpu_power_watts{{{C}}})",
                w=4,
                desc="Total power draw of every GPU the agents report.",
            )
        )
        .with_panel(
            series("Step time by job", "s", (f"stepwatch_job_step_seconds{{{JOB}}}", "{{job_id}}"))
        )
        .with_panel(
            series(
                "Throughput by job",
                "suffix: tokens/s",
                (f"stepwatch_job_tokens_per_second{{{JOB}}}", "{{job_id}}"),
            )
        )
        .with_panel(
            series("MFU by job", "percentunit", (f"stepwatch_job_mfu_ratio{{{JOB}}}", "{{job_id}}"))
        )
        .with_panel(
            series(
                "Goodput by job",
                "percentunit",
                (f"stepwatch_job_goodput_ratio{{{JOB}}}", "{{job_id}}"),
            )
        )
        .with_panel(
            series(
                "GPU power by host",
                "watt",
                (f"sum by (host) (stepwatch_gpu_power_watts{{{C}}})", "{{host}}"),
                (f"sum(stepwatch_gpu_power_watts{{{C}}})", "fleet total"),
                w=24,
            )
        )
        .with_row(Row("Flagged"))
        .with_panel(
            prom_table(
                "Flagged ranks (score = relative slowdown)",
                "percentunit",
                f"stepwatch_rank_flagged_score{{{JOB}}}",
                links={"Job drill-down": JOB_LINK, "Node health": NODE_LINK},
                desc="Click a row for the job drill-down or the node's health.",
            )
        )
        .with_panel(
            prom_table(
                "Firing alerts",
                "short",
                f'ALERTS{{alertstate="firing", {C}}}',
                fault_only=True,
                desc="Empty while nothing fires.",
            )
        )
    )


def job() -> Dashboard:
    heat = f"""
SELECT toStartOfInterval(start_ts, INTERVAL 10 second) AS time, toString(rank) AS rank,
       avg(compute_s) AS compute_s
FROM step_events
WHERE job_id = {sql_value("job_id")} AND $__timeFilter(start_ts)
GROUP BY time, rank
ORDER BY time, rank"""
    pct = f"""
SELECT toStartOfInterval(start_ts, INTERVAL 30 second) AS time,
       quantile(0.5)(duration_s) AS p50, quantile(0.99)(duration_s) AS p99,
       max(compute_s) AS slowest_compute
FROM step_events
WHERE job_id = {sql_value("job_id")} AND $__timeFilter(start_ts)
GROUP BY time ORDER BY time"""
    dets = f"""
SELECT ts, type, state, subject_host AS host, rank, cause, score, step, summary
FROM detections
WHERE job_id = {sql_value("job_id")} AND $__timeFilter(ts)
ORDER BY ts DESC LIMIT 200"""
    return (
        _base("stepwatch-job", "stepwatch / Job drill-down", "job")
        .with_variable(
            _var(
                "job_id",
                f"label_values(stepwatch_job_step_seconds{{{C}}}, job_id)",
                "job",
                multi=False,
            )
        )
        .with_panel(
            single(
                "Step time",
                "s",
                f"stepwatch_job_step_seconds{{{JOB}}}",
                desc="Median wall time of the recent steps (waiting for a straggler "
                "included); the straggler-free baseline is its own series below.",
            )
        )
        .with_panel(
            single(
                "MFU",
                "percentunit",
                f"stepwatch_job_mfu_ratio{{{JOB}}}",
                desc="No value: MFU needs flops_per_step (the SDK's step.flops) and "
                "peak_flops (a GPU model the detection config knows).",
            )
        )
        .with_panel(single("Goodput", "percentunit", f"stepwatch_job_goodput_ratio{{{JOB}}}"))
        .with_panel(single("Stragglers", "short", f"stepwatch_job_stragglers{{{JOB}}}"))
        .with_panel(
            ch_heatmap(
                "Compute time per rank (ClickHouse)",
                "s",
                heat,
                desc="Forward + backward + optimizer per rank, 10 s buckets.",
            )
        )
        .with_panel(
            series(
                "Throughput",
                "suffix: tokens/s",
                (f"stepwatch_job_tokens_per_second{{{JOB}}}", "tokens/s"),
                (f"stepwatch_job_samples_per_second{{{JOB}}}", "samples/s"),
            )
        )
        .with_panel(
            series(
                "Badput by reason",
                "s",
                (f"stepwatch_job_badput_seconds{{{JOB}}}", "{{reason}}"),
                desc="Seconds lost since the job started: data_loading, checkpoint, "
                "straggler (above the straggler-free baseline), hang, restart, "
                "wasted_progress, other.",
            )
        )
        .with_panel(
            series(
                "Step time vs straggler-free baseline",
                "s",
                (f"stepwatch_job_step_seconds{{{JOB}}}", "step time (median)"),
                (f"stepwatch_job_step_baseline_seconds{{{JOB}}}", "straggler-free baseline"),
            )
        )
        .with_panel(ch_series("Step time percentiles (ClickHouse)", "s", pct))
        .with_panel(
            prom_table(
                "Flagged ranks",
                "percentunit",
                f"stepwatch_rank_flagged_score{{{JOB}}}",
                links={"Node health": NODE_LINK},
                desc="Click a row for the flagged host's GPU health.",
            )
        )
        .with_panel(ch_table("Detections (ClickHouse)", "none", dets))
    )


def node() -> Dashboard:
    where = f"match(host, {sql_regex('host')}) AND match(toString(gpu), {sql_regex('gpu')})"
    nvlink = f"""
SELECT ts AS time, concat(host, ' gpu', toString(gpu)) AS series,
       nvlink_tx_bytes_per_s + nvlink_rx_bytes_per_s AS nvlink_bytes_per_s
FROM gpu_samples
WHERE {where} AND $__timeFilter(ts)
ORDER BY time"""
    framebuffer = f"""
SELECT ts AS time, concat(host, ' gpu', toString(gpu)) AS series, fb_used_mib AS fb_used
FROM gpu_samples
WHERE {where} AND fb_used_mib IS NOT NULL AND $__timeFilter(ts)
ORDER BY time"""
    gpu_series = "stepwatch_gpu_sm_clock_hertz"
    return (
        _base("stepwatch-node", "stepwatch / Node and GPU health", "gpu")
        .with_variable(_var("host", f"label_values({gpu_series}{{{C}}}, host)", "host"))
        .with_variable(_var("gpu", f'label_values({gpu_series}{{host=~"$host", {C}}}, gpu)', "gpu"))
        .with_row(Row("Errors"))
        .with_panel(
            series(
                "XID events",
                "short",
                (
                    "sum by (host, gpu, xid) "
                    f"(increase(stepwatch_gpu_xid_events_total{{{GPU_HOST}}}[{RATE}]))",
                    GPU + " xid {{xid}}",
                ),
                desc="Counted XID events per interval (not dcgm's last-XID gauge).",
            )
        )
        .with_panel(
            series(
                "ECC errors",
                "short",
                (
                    f"increase(stepwatch_gpu_ecc_double_bit_errors_total{{{GPU_HOST}}}[{RATE}])",
                    "DBE " + GPU,
                ),
                (
                    f"increase(stepwatch_gpu_ecc_single_bit_errors_total{{{GPU_HOST}}}[{RATE}])",
                    "SBE " + GPU,
                ),
            )
        )
        .with_panel(
            series(
                "Remapped rows",
                "short",
                (
                    f"stepwatch_gpu_remapped_rows_uncorrectable_total{{{GPU_HOST}}}",
                    "uncorrectable " + GPU,
                ),
                (f"stepwatch_gpu_remapped_rows_pending{{{GPU_HOST}}}", "pending " + GPU),
            )
        )
        .with_panel(
            series(
                "PCIe replays",
                "cps",
                (f"rate(stepwatch_gpu_pcie_replay_total{{{GPU_HOST}}}[{RATE}])", GPU),
            )
        )
        .with_panel(ch_series("NVLink traffic (ClickHouse)", "Bps", nvlink))
        .with_panel(
            ch_series(
                "Framebuffer used (ClickHouse)",
                "mbytes",
                framebuffer,
                desc="GPU memory used (MiB, dcgm's DCGM_FI_DEV_FB_USED) from the store.",
            )
        )
        .with_row(Row("Clocks, heat, power"))
        .with_panel(
            series(
                "SM clock",
                "hertz",
                (f"stepwatch_gpu_sm_clock_hertz{{{GPU_HOST}}}", GPU),
                (f"max(stepwatch_gpu_sm_clock_max_hertz{{{GPU_HOST}}})", "max"),
            )
        )
        .with_panel(
            series(
                "Clock event reasons (throttling)",
                "short",
                (
                    f"sum by (host, reason) (stepwatch_gpu_clocks_event_active{{{GPU_HOST}}})",
                    "{{host}} {{reason}}",
                ),
            )
        )
        .with_panel(
            series(
                "GPU temperature",
                "celsius",
                (f"stepwatch_gpu_temperature_celsius{{{GPU_HOST}}}", GPU),
            )
        )
        .with_panel(
            series(
                "Power",
                "watt",
                (f"stepwatch_gpu_power_watts{{{GPU_HOST}}}", GPU),
                (f"stepwatch_gpu_power_limit_watts{{{GPU_HOST}}}", "limit " + GPU),
            )
        )
        .with_panel(
            single(
                "Power of the selected GPUs",
                "watt",
                f"sum(stepwatch_gpu_power_watts{{{GPU_HOST}}})",
                w=12,
            )
        )
        .with_panel(
            series(
                "Utilisation and tensor activity",
                "percentunit",
                (f"stepwatch_gpu_utilization_ratio{{{GPU_HOST}}}", "util " + GPU),
                (f"stepwatch_gpu_tensor_active_ratio{{{GPU_HOST}}}", "tensor " + GPU),
            )
        )
    )


def network() -> Dashboard:
    port = "{{host}} {{device}}/{{port}}"
    hot = f"""
SELECT host, device, port, sum(xmit_wait_per_s * dt_s) AS xmit_wait_ticks,
       sum(np_ecn_marked_roce_packets_per_s * dt_s) AS ecn_marked,
       sum(symbol_error_per_s * dt_s) AS symbol_errors
FROM port_samples
WHERE match(host, {sql_regex("host")}) AND $__timeFilter(ts)
GROUP BY host, device, port
ORDER BY xmit_wait_ticks DESC LIMIT 20"""
    # one finding per port however many jobs reported it, fleet-wide (the port is the
    # fabric's, whichever host is selected; the saved query port_findings)
    findings = """
SELECT subject_host AS host, device, port, uniqExact(job_id) AS jobs,
       uniqExact(id) AS detections, \
arrayStringConcat(arraySort(groupUniqArray(type)), ',') AS types,
       max(ts) AS last_seen
FROM detections FINAL
WHERE $__timeFilter(ts) AND state = 'open' AND device != ''
  AND port IS NOT NULL
GROUP BY host, device, port
ORDER BY jobs DESC, detections DESC, last_seen DESC LIMIT 20"""
    return (
        _base("stepwatch-network", "stepwatch / Network fabric", "network")
        .with_variable(
            _var("host", f"label_values(stepwatch_infiniband_port_up{{{C}}}, host)", "host")
        )
        .with_row(Row("Traffic"))
        .with_panel(
            series(
                "Transmit",
                "Bps",
                (
                    f"rate(stepwatch_infiniband_port_data_transmitted_bytes_total{{{HOST}}}[{RATE}])",
                    port,
                ),
            )
        )
        .with_panel(
            series(
                "Receive",
                "Bps",
                (
                    f"rate(stepwatch_infiniband_port_data_received_bytes_total{{{HOST}}}[{RATE}])",
                    port,
                ),
            )
        )
        .with_panel(
            series(
                "Link rate", "Bps", (f"stepwatch_infiniband_rate_bytes_per_second{{{HOST}}}", port)
            )
        )
        .with_panel(series("Port up", "bool", (f"stepwatch_infiniband_port_up{{{HOST}}}", port)))
        .with_row(Row("Congestion"))
        .with_panel(
            series(
                "Transmit wait (congestion)",
                "cps",
                (f"rate(stepwatch_infiniband_port_transmit_wait_total{{{HOST}}}[{RATE}])", port),
            )
        )
        .with_panel(
            series(
                "ECN marked / CNP",
                "pps",
                (
                    f"rate(stepwatch_roce_np_ecn_marked_roce_packets_total{{{HOST}}}[{RATE}])",
                    "ECN " + port,
                ),
                (f"rate(stepwatch_roce_np_cnp_sent_total{{{HOST}}}[{RATE}])", "CNP sent " + port),
                (
                    f"rate(stepwatch_roce_rp_cnp_handled_total{{{HOST}}}[{RATE}])",
                    "CNP handled " + port,
                ),
            )
        )
        .with_row(Row("Errors"))
        .with_panel(
            series(
                "Link errors",
                "short",
                (
                    f"increase(stepwatch_infiniband_symbol_error_total{{{HOST}}}[{RATE}])",
                    "symbol " + port,
                ),
                (
                    f"increase(stepwatch_infiniband_link_downed_total{{{HOST}}}[{RATE}])",
                    "downed " + port,
                ),
                (
                    f"increase(stepwatch_infiniband_port_errors_received_total{{{HOST}}}[{RATE}])",
                    "rcv errors " + port,
                ),
            )
        )
        .with_panel(
            series(
                "RoCE transport errors",
                "cps",
                (f"rate(stepwatch_roce_out_of_sequence_total{{{HOST}}}[{RATE}])", "OOS " + port),
                (
                    f"rate(stepwatch_roce_local_ack_timeout_err_total{{{HOST}}}[{RATE}])",
                    "ack timeout " + port,
                ),
            )
        )
        .with_panel(ch_table("Hot ports (ClickHouse)", "short", hot))
        .with_panel(ch_table("Port findings across jobs (ClickHouse)", "short", findings))
    )


def pipeline() -> Dashboard:
    return (
        _base("stepwatch-pipeline", "stepwatch / Pipeline health", "pipeline")
        .with_row(Row("Agents"))
        .with_panel(
            series(
                "Agent spool",
                "bytes",
                (f"stepwatch_agent_spool_bytes{{{C}}}", "{{instance}}"),
                (f"stepwatch_agent_spool_max_bytes{{{C}}}", "bound {{instance}}"),
            )
        )
        .with_panel(
            series("Agent broker up", "bool", (f"stepwatch_agent_broker_up{{{C}}}", "{{instance}}"))
        )
        .with_row(Row("Stream workers"))
        .with_panel(
            series(
                "Stream consumer lag",
                "short",
                (f"sum by (kind) (stepwatch_stream_consumer_lag_messages{{{C}}})", "{{kind}}"),
            )
        )
        .with_panel(
            series(
                "Stream events",
                "cps",
                (f"sum by (kind) (rate(stepwatch_stream_events_total{{{C}}}[{RATE}]))", "{{kind}}"),
            )
        )
        .with_panel(
            series(
                "Dead letters",
                "cps",
                (
                    f"sum by (reason) (rate(stepwatch_stream_dlq_messages_total{{{C}}}[{RATE}]))",
                    "stream {{reason}}",
                ),
                (
                    f"sum by (reason) (rate(stepwatch_sink_dead_letter_rows_total{{{C}}}[{RATE}]))",
                    "sink {{reason}}",
                ),
            )
        )
        .with_panel(
            series("Workers ready", "bool", (f"stepwatch_stream_ready{{{C}}}", "{{instance}}"))
        )
        .with_row(Row("ClickHouse sink"))
        .with_panel(
            series(
                "Rows inserted",
                "rowsps",
                (
                    f"sum by (table) (rate(stepwatch_sink_rows_inserted_total{{{C}}}[{RATE}]))",
                    "{{table}}",
                ),
            )
        )
        .with_panel(
            series(
                "Sink lag",
                "short",
                (f"sum(stepwatch_sink_consumer_lag_messages{{{C}}})", "lag"),
                (f"stepwatch_sink_buffered_messages{{{C}}}", "buffered"),
            )
        )
        .with_panel(
            series(
                "Seconds since the sink's last commit",
                "s",
                (f"time() - stepwatch_sink_last_commit_timestamp_seconds{{{C}}}", "{{instance}}"),
            )
        )
        .with_panel(
            series(
                "Insert time p99",
                "s",
                (
                    "histogram_quantile(0.99, sum by (le, table) "
                    f"(rate(stepwatch_sink_insert_seconds_bucket{{{C}}}[{RATE}])))",
                    "{{table}}",
                ),
            )
        )
        .with_row(Row("Remediator"))
        .with_panel(
            series(
                "Remediator decisions",
                "short",
                (
                    "sum by (action, outcome) "
                    f"(increase(stepwatch_remediator_decisions_total{{{C}}}[1h]))",
                    "{{action}} {{outcome}}",
                ),
                fault_only=True,
                desc="Only once the remediator has decided something.",
            )
        )
        .with_panel(
            series(
                "Circuit breaker open",
                "bool",
                (f"stepwatch_remediator_circuit_breaker_open{{{C}}}", "open"),
                fault_only=True,
                desc="1 while open; a person must close it.",
            )
        )
        .with_panel(
            series(
                "Actuator errors",
                "short",
                (
                    "sum by (actuator, kind) "
                    f"(increase(stepwatch_remediator_actuator_errors_total{{{C}}}[1h]))",
                    "{{actuator}} {{kind}}",
                ),
                fault_only=True,
            )
        )
    )


DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "fleet-overview": fleet,
    "job-drilldown": job,
    "node-gpu-health": node,
    "network-fabric": network,
    "pipeline-health": pipeline,
}


def render(name: str) -> str:
    built = json.loads(json.dumps(DASHBOARDS[name]().build(), cls=JSONEncoder))
    return json.dumps(finish(built), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    OUT.mkdir(exist_ok=True)
    for name in DASHBOARDS:
        path = OUT / f"{name}.json"
        text = render(name)
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
