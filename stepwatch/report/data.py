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
from stepwatch.report.goodput import CHECKPOINT_EVENTS, RESTART_EVENTS

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

# The lowest rank's steps in time order: where its step numbers go back a new run of the
# job (a restart from a checkpoint, a requeue) begins (run_starts).
RUNS = """
SELECT step, toFloat64(start_ts) AS start, toFloat64(end_ts) AS end
FROM step_events FINAL
WHERE job_id = {job:String}
  AND rank = (SELECT min(rank) FROM step_events WHERE job_id = {job:String})
ORDER BY start_ts, step
"""

# One row per step of each run: a step run again after a restart is a row of its own
# (run: how many of run_starts' times lie at or before its start), so a step never spans
# the outage between two runs. start, end: the median rank's (each rank's times are on its
# host's clock: a host whose clock is off moves the earliest start or the latest end by its
# offset, and so the run's wall time, but not the median; the worker counts wall time on
# the median rank's clock too). hosts: a key of the step's set of hosts.
STEPS = """
SELECT arrayCount(b -> b <= toFloat64(e.start_ts), {runs:Array(Float64)}) AS run, step,
       quantileExactInclusive(0.5)(toFloat64(e.start_ts)) AS start,
       quantileExactInclusive(0.5)(toFloat64(e.end_ts)) AS end,
       median(duration_s) AS step_s, max(duration_s) AS step_max_s,
       sum(tokens) AS tokens, sum(samples) AS samples, max(world_size) AS world,
       sum(duration_s) AS rank_s, sum(ifNull(data_s, 0)) AS data_s,
       sum(ifNull(checkpoint_s, 0)) AS checkpoint_s, count() AS rows,
       uniqExact(rank) AS ranks, median(ifNull(e.data_s, 0)) AS data_med,
       median(ifNull(e.checkpoint_s, 0)) AS ckpt_med, argMax(rank, duration_s) AS slowest_rank,
       if(count(flops) = count(), sum(flops), NULL) AS flops,
       if(count(e.comm_wait_s) = count(), median(e.comm_wait_s) - min(e.comm_wait_s), NULL)
           AS wait_excess,
       toString(cityHash64(arraySort(groupUniqArray(toString(e.host))))) AS hosts
FROM step_events AS e FINAL
WHERE job_id = {job:String}
GROUP BY run, step
ORDER BY run, step
"""

# A rank-only detection's host: where the rank ran when the detection opened (a requeued
# rank has a placement per allocation): of its placements that had started by then, the
# one running then (or that ran last), the latest to start.
DETECTIONS = """
WITH placed AS (
    SELECT d.rank AS rank, d.at AS at,
           argMax(p.host, (p.first_seen <= d.at, least(d.at, p.last_seen), p.first_seen)) AS host
    FROM
    (
        SELECT DISTINCT rank, ifNull(opened_at, ts) AS at
        FROM detections
        WHERE job_id = {job:String} AND rank IS NOT NULL
    ) AS d
    INNER JOIN
    (
        SELECT rank, host, min(first_seen) AS first_seen, max(last_seen) AS last_seen
        FROM rank_placement
        WHERE job_id = {job:String}
        GROUP BY rank, host
    ) AS p ON d.rank = p.rank
    GROUP BY rank, at
)
SELECT toFloat64(d.ts) AS ts, d.id AS id, d.type AS type, d.state AS state, d.rank AS rank,
       d.gpu AS gpu, d.cause AS cause, d.fault AS fault, d.score AS score, d.step AS step,
       d.first_step AS first_step, d.summary AS summary, d.evidence AS evidence,
       if(d.subject_host != '', toString(d.subject_host), ifNull(p.host, '')) AS host
FROM detections AS d FINAL
LEFT JOIN placed AS p ON d.rank = p.rank AND ifNull(d.opened_at, d.ts) = p.at
WHERE d.job_id = {job:String}
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

# duration_s: a checkpoint event's (the SDK's duration_s, the simulator's seconds), and
# started: when it began (the SDK's start; else it ended at ts). The events goodput reads
# (report.goodput's RESTART_EVENTS and CHECKPOINT_EVENTS) only from hosts that ran the
# job's steps: any host may name a job, and one that never ran it would turn the job's
# hang into restart or checkpoint time (the stream worker dead-letters such events as
# foreign_job; the store may hold them from before that gate, or written around it).
# Hardware events (an XID from a node that failed before its first step) stay.
_CLAIMS = ", ".join(f"'{t}'" for t in (*RESTART_EVENTS, *CHECKPOINT_EVENTS))
EVENTS = f"""
SELECT toFloat64(ts) AS ts, host, type, gpu, device, port, code, detail,
       toFloat64OrNull(if(attrs['duration_s'] != '', attrs['duration_s'], attrs['seconds']))
           AS duration_s,
       toFloat64OrNull(attrs['start']) AS started
FROM events FINAL
WHERE job_id = {{job:String}}
  AND (type NOT IN ({_CLAIMS})
       OR host IN (SELECT DISTINCT host FROM step_events WHERE job_id = {{job:String}}))
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
    # lists, not literals: the client binds them (clickhouse-connect escapes a string, so
    # a ready-made "['a']" reached the owner's endpoint as a String, not an Array)
    host_params: dict[str, Any] = {"job": job, "hosts": hosts}
    starts = run_starts(_rows(store, RUNS, p))
    steps = _rows(store, STEPS, {"job": job, "runs": starts})
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


def run_starts(rows: Rows) -> list[float]:
    """Where each run after the first begins, from one rank's steps in time order: a step
    numbered at most the run's highest so far that starts after every earlier step ended
    is a restart (an earlier start is a late or repeated record). The boundary is the
    middle of the outage, so every rank's steps fall on the right side of it."""
    starts: list[float] = []
    top, last_end = -1, float("-inf")
    for r in rows:
        step, start = int(r["step"]), float(r["start"])
        if step <= top and start >= last_end:
            starts.append((last_end + start) / 2)
            top = step
        top, last_end = max(top, step), max(last_end, float(r["end"]))
    return starts
