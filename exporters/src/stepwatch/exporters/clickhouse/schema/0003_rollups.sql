-- Per-job per-minute rollups that dashboards read instead of raw rows, and the
-- rank -> host placement every host-level question needs. Materialized views
-- fill them at insert time; their targets carry the deduplication window so a
-- replayed (deduplicated) insert is not counted twice.

CREATE TABLE IF NOT EXISTS step_rollup_1m
(
    job_id LowCardinality(String),
    minute DateTime('UTC'),
    rank_steps SimpleAggregateFunction(sum, UInt64),
    min_step SimpleAggregateFunction(min, UInt64),
    max_step SimpleAggregateFunction(max, UInt64),
    world_size SimpleAggregateFunction(max, UInt32),
    first_start SimpleAggregateFunction(min, DateTime64(6, 'UTC')),
    last_end SimpleAggregateFunction(max, DateTime64(6, 'UTC')),
    rank_seconds SimpleAggregateFunction(sum, Float64),
    compute_seconds SimpleAggregateFunction(sum, Float64),
    comm_wait_seconds SimpleAggregateFunction(sum, Float64),
    data_seconds SimpleAggregateFunction(sum, Float64),
    checkpoint_seconds SimpleAggregateFunction(sum, Float64),
    samples SimpleAggregateFunction(sum, UInt64),
    tokens SimpleAggregateFunction(sum, UInt64),
    flops SimpleAggregateFunction(sum, Float64),
    flops_rank_steps SimpleAggregateFunction(sum, UInt64),
    duration_q AggregateFunction(quantilesTDigest(0.5, 0.9, 0.99), Float32),
    compute_q AggregateFunction(quantilesTDigest(0.5, 0.9, 0.99), Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (job_id, minute)
TTL minute + INTERVAL 730 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS step_rollup_1m_mv TO step_rollup_1m AS
SELECT
    job_id,
    toStartOfMinute(start_ts) AS minute,
    count() AS rank_steps,
    min(step) AS min_step,
    max(step) AS max_step,
    max(world_size) AS world_size,
    min(start_ts) AS first_start,
    max(end_ts) AS last_end,
    sum(toFloat64(duration_s)) AS rank_seconds,
    sum(toFloat64(ifNull(compute_s, 0))) AS compute_seconds,
    sum(toFloat64(ifNull(comm_wait_s, 0))) AS comm_wait_seconds,
    sum(toFloat64(ifNull(data_s, 0))) AS data_seconds,
    sum(toFloat64(ifNull(checkpoint_s, 0))) AS checkpoint_seconds,
    sum(samples) AS samples,
    sum(tokens) AS tokens,
    sum(ifNull(flops, 0)) AS flops,
    countIf(step_events.flops IS NOT NULL) AS flops_rank_steps,
    quantilesTDigestState(0.5, 0.9, 0.99)(duration_s) AS duration_q,
    quantilesTDigestStateIf(0.5, 0.9, 0.99)(assumeNotNull(compute_s), compute_s IS NOT NULL) AS compute_q
FROM step_events
GROUP BY job_id, minute;

CREATE TABLE IF NOT EXISTS gpu_rollup_1m
(
    job_id LowCardinality(String),
    host LowCardinality(String),
    gpu UInt16,
    minute DateTime('UTC'),
    samples SimpleAggregateFunction(sum, UInt64),
    util_gpu_pct AggregateFunction(avg, Float32),
    power_w AggregateFunction(avg, Float32),
    temp_gpu_c_max SimpleAggregateFunction(max, Float32),
    sm_clock_mhz_min SimpleAggregateFunction(min, Float32),
    throttled_samples SimpleAggregateFunction(sum, UInt64),
    ecc_sbe_new SimpleAggregateFunction(sum, UInt64),
    ecc_dbe_new SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (job_id, minute, host, gpu)
TTL minute + INTERVAL 730 DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- throttled: SwPowerCap 0x4 | HwSlowdown 0x8 | SwThermal 0x20 | HwThermal 0x40 | PowerBrake 0x80
CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_rollup_1m_mv TO gpu_rollup_1m AS
SELECT
    job_id, host, gpu,
    toStartOfMinute(ts) AS minute,
    count() AS samples,
    avgStateIf(assumeNotNull(util_gpu_pct), util_gpu_pct IS NOT NULL) AS util_gpu_pct,
    avgStateIf(assumeNotNull(power_w), power_w IS NOT NULL) AS power_w,
    max(ifNull(temp_gpu_c, 0)) AS temp_gpu_c_max,
    min(ifNull(sm_clock_mhz, inf)) AS sm_clock_mhz_min,
    countIf(bitAnd(ifNull(throttle_reasons, 0), 236) != 0) AS throttled_samples,
    sum(ifNull(ecc_sbe_new, 0)) AS ecc_sbe_new,
    sum(ifNull(ecc_dbe_new, 0)) AS ecc_dbe_new
FROM gpu_samples
GROUP BY job_id, host, gpu, minute;

CREATE TABLE IF NOT EXISTS port_rollup_1m
(
    job_id LowCardinality(String),
    host LowCardinality(String),
    device LowCardinality(String),
    port UInt16,
    minute DateTime('UTC'),
    samples SimpleAggregateFunction(sum, UInt64),
    xmit_bytes SimpleAggregateFunction(sum, Float64),
    rcv_bytes SimpleAggregateFunction(sum, Float64),
    xmit_wait SimpleAggregateFunction(sum, Float64),
    xmit_wait_per_s_max SimpleAggregateFunction(max, Float64),
    link_errors SimpleAggregateFunction(sum, Float64),
    congestion_marks SimpleAggregateFunction(sum, Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (job_id, minute, host, device, port)
TTL minute + INTERVAL 730 DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS port_rollup_1m_mv TO port_rollup_1m AS
SELECT
    job_id, host, device, port,
    toStartOfMinute(ts) AS minute,
    count() AS samples,
    sum(ifNull(xmit_bytes_per_s * dt_s, 0)) AS xmit_bytes,
    sum(ifNull(rcv_bytes_per_s * dt_s, 0)) AS rcv_bytes,
    sum(ifNull(xmit_wait_per_s * dt_s, 0)) AS xmit_wait,
    max(ifNull(xmit_wait_per_s, 0)) AS xmit_wait_per_s_max,
    sum(ifNull((ifNull(symbol_error_per_s, 0) + ifNull(link_downed_per_s, 0)
        + ifNull(rcv_errors_per_s, 0) + ifNull(link_error_recovery_per_s, 0)
        + ifNull(local_link_integrity_errors_per_s, 0)) * dt_s, 0)) AS link_errors,
    sum(ifNull((ifNull(np_ecn_marked_roce_packets_per_s, 0) + ifNull(np_cnp_sent_per_s, 0)
        + ifNull(rp_cnp_handled_per_s, 0)) * dt_s, 0)) AS congestion_marks
FROM port_samples
GROUP BY job_id, host, device, port, minute;

CREATE TABLE IF NOT EXISTS rank_placement
(
    job_id LowCardinality(String),
    rank UInt32,
    host LowCardinality(String),
    gpu UInt16,
    world_size SimpleAggregateFunction(max, UInt32),
    first_seen SimpleAggregateFunction(min, DateTime64(6, 'UTC')),
    last_seen SimpleAggregateFunction(max, DateTime64(6, 'UTC')),
    rank_steps SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
ORDER BY (job_id, rank, host, gpu)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS rank_placement_mv TO rank_placement AS
SELECT
    job_id, rank, host, gpu,
    max(world_size) AS world_size,
    min(start_ts) AS first_seen,
    max(end_ts) AS last_seen,
    count() AS rank_steps
FROM step_events
GROUP BY job_id, rank, host, gpu;
