-- lemon_nodes: hosts that are slow in many jobs (MegaScale's "lemon nodes")
--
-- For each job, every host's median compute time per step (forward + backward
-- + optimizer, checkpoint steps left out) is divided by the job's median over
-- its hosts; a ratio of at least slow_ratio counts the job as slow on that
-- host. Straggler detections count too: a detection names its host, or a
-- rank, placed through rank_placement on the host the rank ran on when the
-- detection opened (a requeued rank has a placement per allocation). A lemon
-- is slow or flagged in at least min_jobs jobs. Synchronous training equalises
-- step *wall* time, so compute, not total step time, is what is compared.
-- @param since DateTime64(3, 'UTC') = -30d  steps and detections from this time on
-- @param min_jobs UInt32 = 2  jobs a host must be slow (or flagged) in
-- @param slow_ratio Float64 = 1.05  host median compute / job median counted as slow
-- @param limit UInt32 = 50  rows at most
WITH
per_host AS (
    SELECT job_id, host, median(compute_s) AS host_compute
    FROM step_events FINAL
    WHERE start_ts >= {since:DateTime64(3, 'UTC')}
      AND compute_s IS NOT NULL AND ifNull(checkpoint_s, 0) = 0
    GROUP BY job_id, host
),
per_job AS (
    SELECT job_id, median(host_compute) AS job_compute
    FROM per_host
    GROUP BY job_id
    HAVING count() >= 2
),
ratios AS (
    SELECT h.host AS host, h.job_id AS job_id, h.host_compute / j.job_compute AS ratio
    FROM per_host AS h
    INNER JOIN per_job AS j ON h.job_id = j.job_id
),
placement AS (
    SELECT job_id, rank, host, min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM rank_placement
    GROUP BY job_id, rank, host
),
placed AS (
    SELECT q.job_id AS job_id, q.rank AS rank, q.at AS at,
           argMax(p.host, (p.first_seen <= q.at, least(q.at, p.last_seen), p.first_seen)) AS host
    FROM
    (
        SELECT DISTINCT job_id, rank, ifNull(opened_at, ts) AS at
        FROM detections
        WHERE type = 'straggler' AND ts >= {since:DateTime64(3, 'UTC')} AND rank IS NOT NULL
    ) AS q
    INNER JOIN placement AS p ON q.job_id = p.job_id AND q.rank = p.rank
    GROUP BY job_id, rank, at
),
flagged AS (
    SELECT if(d.subject_host != '', d.subject_host, p.host) AS host,
           uniqExact(d.job_id) AS flagged_jobs
    FROM detections AS d FINAL
    LEFT JOIN placed AS p
        ON d.job_id = p.job_id AND d.rank = p.rank AND ifNull(d.opened_at, d.ts) = p.at
    WHERE d.type = 'straggler' AND d.ts >= {since:DateTime64(3, 'UTC')}
    GROUP BY host
    HAVING host != ''
)
SELECT
    r.host AS host,
    r.jobs AS jobs,
    r.slow_jobs AS slow_jobs,
    f.flagged_jobs AS flagged_jobs,
    r.median_ratio AS median_ratio,
    r.max_ratio AS max_ratio,
    r.slow_job_ids AS slow_job_ids
FROM
(
    SELECT
        host,
        uniqExact(job_id) AS jobs,
        uniqExactIf(job_id, ratio >= {slow_ratio:Float64}) AS slow_jobs,
        round(median(ratio), 3) AS median_ratio,
        round(max(ratio), 3) AS max_ratio,
        arraySort(groupUniqArrayIf(job_id, ratio >= {slow_ratio:Float64})) AS slow_job_ids
    FROM ratios
    GROUP BY host
) AS r
LEFT JOIN flagged AS f ON r.host = f.host
WHERE greatest(r.slow_jobs, f.flagged_jobs) >= {min_jobs:UInt32}
ORDER BY greatest(slow_jobs, flagged_jobs) DESC, median_ratio DESC, host
LIMIT {limit:UInt32}
