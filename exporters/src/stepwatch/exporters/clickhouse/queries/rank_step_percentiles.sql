-- rank_step_percentiles: per-rank step-time and compute percentiles of one job
--
-- One row per placement of a rank (rank, host, GPU, peer group): a job
-- requeued on other nodes has a row for each allocation a rank ran on, so a
-- slow GPU keeps its own row (on its host) instead of being averaged with the
-- rank's steps elsewhere. Step wall time is nearly equal on every rank of a
-- synchronous job; the straggler shows in compute (high) and comm_wait (low),
-- and its peers in comm_wait (high). compute_vs_group is the row's median
-- compute over the median of the rows of its peer group (same pipeline
-- stage): 1.10 means 10 % slower. first_step and last_step: the steps the
-- rank ran there.
-- Reads without FINAL: the sink never writes a row twice, an upstream
-- re-send it missed is one row among thousands per rank, which moves no
-- percentile, and FINAL costs up to 2x on a big job.
-- @param job String  the job
-- @param since DateTime64(3, 'UTC') = 0  steps from this time on
-- @param limit UInt32 = 100000  rows at most
SELECT
    rank,
    host,
    gpu,
    peer_group,
    steps,
    first_step,
    last_step,
    round(step_q[1], 4) AS step_p50_s,
    round(step_q[2], 4) AS step_p90_s,
    round(step_q[3], 4) AS step_p99_s,
    round(compute_q[1], 4) AS compute_p50_s,
    round(compute_q[2], 4) AS compute_p90_s,
    round(compute_q[3], 4) AS compute_p99_s,
    round(comm_wait_p50, 4) AS comm_wait_p50_s,
    round(data_p50, 4) AS data_p50_s,
    round(compute_q[1] / median(compute_q[1]) OVER (PARTITION BY peer_group), 4) AS compute_vs_group
FROM
(
    SELECT
        rank,
        host,
        gpu,
        peer_group,
        count() AS steps,
        min(step) AS first_step,
        max(step) AS last_step,
        min(start_ts) AS first_start,
        quantilesExact(0.5, 0.9, 0.99)(duration_s) AS step_q,
        quantilesExact(0.5, 0.9, 0.99)(compute_s) AS compute_q,
        quantileExact(0.5)(comm_wait_s) AS comm_wait_p50,
        quantileExact(0.5)(data_s) AS data_p50
    FROM step_events
    WHERE job_id = {job:String} AND start_ts >= {since:DateTime64(3, 'UTC')}
    GROUP BY rank, host, gpu, peer_group
)
ORDER BY rank, first_start, host, gpu
LIMIT {limit:UInt32}
