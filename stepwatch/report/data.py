"""What a post-mortem report reads from the historical store, one query each.

Every query takes the job as a server-side parameter and reads with ``FINAL``
(upstream duplicates collapsed). The store is whatever
:func:`stepwatch.exporters.clickhouse.access.open_reader` gives: a server, the
embedded store owner's endpoint, or the directory itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepwatch.exporters.clickhouse.store import Store

MAX_STEP_COLUMNS = 400  # heat-map columns at most: longer runs are bucketed by step
MAX_PEER_POINTS = 600  # points of a NIC peer-baseline line at most

HEAT = """
WITH (SELECT greatest(1, intDiv(max(step) - min(step), {cols:UInt32}) + 1)
      FROM step_events WHERE job_id = {job:String}) AS width
SELECT rank, intDiv(step, width) * width AS step_bucket, avg(compute_s) AS compute_s,
       toFloat64(min(start_ts)) AS start, toFloat64(max(end_ts)) AS end
FROM step_events FINAL
WHERE job_id = {job:String}
GROUP BY rank, step_bucket
ORDER BY rank, step_bucket
"""

STEPS = """
SELECT step, toFloat64(min(start_ts)) AS start, toFloat64(max(end_ts)) AS end,
       median(duration_s) AS step_s, max(duration_s) AS step_max_s,
       sum(tokens) AS tokens, sum(samples) AS samples, max(world_size) AS world,
       sum(duration_s) AS rank_s, sum(ifNull(data_s, 0)) AS data_s,
       sum(ifNull(checkpoint_s, 0)) AS checkpoint_s, count() AS rows,
       uniqExact(rank) AS ranks, median(ifNull(e.data_s, 0)) AS data_med,
       median(ifNull(e.checkpoint_s, 0)) AS ckpt_med, argMax(rank, duration_s) AS slowest_rank,
       if(count(flops) = count(), sum(flops), NULL) AS flops,
       if(count(e.comm_wait_s) = count(), median(e.comm_wait_s) - min(e.comm_wait_s), NULL)
           AS wait_excess
FROM step_events AS e FINAL
WHERE job_id = {job:String}
GROUP BY step
ORDER BY step
"""

DETECTIONS = """
SELECT toFloat64(ts) AS ts, id, type, state, rank, gpu, cause, fault, score, step,
       first_step, summary, evidence,
       if(subject_host != '', subject_host,
          ifNull((SELECT any(host) FROM rank_placement p
                  WHERE p.job_id = {job:String} AND p.rank = d.rank), '')) AS host
FROM detections AS d FINAL
WHERE job_id = {job:String}
ORDER BY ts, id
"""

ALERTS = """
SELECT toFloat64(if(status = 'resolved', ifNull(ends_at, received_at), starts_at)) AS ts,
       alertname, status, severity, host, fingerprint, toFloat64(starts_at) AS starts,
       toFloat64(ends_at) AS ends
FROM alerts FINAL
WHERE job_id = {job:String}
ORDER BY ts
"""

ACTIONS = """
SELECT toFloat64(ts) AS ts, action, status, dry_run, host, reason
FROM remediation_actions FINAL
WHERE job_id = {job:String}
ORDER BY ts
"""

EVENTS = """
SELECT toFloat64(ts) AS ts, host, type, gpu, device, port, code, detail
FROM events FINAL
WHERE job_id = {job:String}
ORDER BY ts
"""

GPU = """
SELECT toFloat64(ts) AS ts, host, gpu, sm_clock_mhz, sm_clock_max_mhz, temp_gpu_c, power_w,
       util_gpu_pct, throttle_reasons, ecc_dbe_new, xid_last
FROM gpu_samples FINAL
WHERE job_id = {job:String} AND host IN {hosts:Array(String)}
ORDER BY host, gpu, ts
"""

PORTS = """
SELECT toFloat64(ts) AS ts, host, device, port, xmit_bytes_per_s, rcv_bytes_per_s,
       xmit_wait_per_s, np_ecn_marked_roce_packets_per_s, rp_cnp_handled_per_s,
       symbol_error_per_s, link_downed_per_s, state
FROM port_samples FINAL
WHERE job_id = {job:String} AND host IN {hosts:Array(String)}
ORDER BY host, device, port, ts
"""

# The NIC peer baseline: per time bucket, the median over every port of the job's
# other hosts (the flagged host excluded), for the columns the NIC figure draws.
PEER_PORTS = """
SELECT toFloat64(toStartOfInterval(ts, toIntervalSecond({bucket:UInt32}))) AS ts,
       median(xmit_bytes_per_s) AS xmit_bytes_per_s, median(xmit_wait_per_s) AS xmit_wait_per_s,
       median(np_ecn_marked_roce_packets_per_s) AS np_ecn_marked_roce_packets_per_s,
       median(symbol_error_per_s) AS symbol_error_per_s, uniqExact(host) AS hosts
FROM port_samples FINAL
WHERE job_id = {job:String} AND host != {host:String}
GROUP BY ts
ORDER BY ts
"""

GPU_MODEL = """
SELECT any(name) FROM gpu_samples WHERE job_id = {job:String} AND name != ''
"""

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class ReportData:
    job: str
    heat: Rows
    steps: Rows
    detections: Rows
    alerts: Rows
    actions: Rows
    events: Rows
    gpu: Rows
    ports: Rows
    peers: dict[str, Rows] = field(default_factory=dict)  # flagged host -> NIC peer baseline
    gpu_model: str = ""  # the job's GPU model name (MFU's peak FLOP/s), '' when unknown

    @property
    def flagged_hosts(self) -> list[str]:
        return sorted({d["host"] for d in self.detections if d.get("host")})


def _rows(store: Store, sql: str, params: dict[str, Any]) -> Rows:
    return store.query(sql, params).dicts()


def _optional(store: Store, sql: str, params: dict[str, Any]) -> Rows:
    """Alerts and actions tables may be absent on an old store: report 'none'."""
    from stepwatch.exporters.clickhouse.store import ClickHouseError

    try:
        return _rows(store, sql, params)
    except ClickHouseError:
        return []


def load(store: Store, job: str) -> ReportData:
    p: dict[str, Any] = {"job": job}
    detections = _rows(store, DETECTIONS, p)
    hosts = sorted({d["host"] for d in detections if d.get("host")})
    host_params = {"job": job, "hosts": "[" + ",".join(_quote(h) for h in hosts) + "]"}
    steps = _rows(store, STEPS, p)
    span = float(steps[-1]["end"]) - float(steps[0]["start"]) if steps else 0.0
    bucket = max(1, int(span // MAX_PEER_POINTS) + 1)
    return ReportData(
        job=job,
        heat=_rows(store, HEAT, {"job": job, "cols": MAX_STEP_COLUMNS}),
        steps=steps,
        detections=detections,
        alerts=_optional(store, ALERTS, p),
        actions=_optional(store, ACTIONS, p),
        events=_rows(store, EVENTS, p),
        gpu=_rows(store, GPU, host_params) if hosts else [],
        ports=_rows(store, PORTS, host_params) if hosts else [],
        peers={
            h: _rows(store, PEER_PORTS, {"job": job, "host": h, "bucket": bucket}) for h in hosts
        },
        gpu_model=str(store.query(GPU_MODEL, p).scalar() or ""),
    )


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
