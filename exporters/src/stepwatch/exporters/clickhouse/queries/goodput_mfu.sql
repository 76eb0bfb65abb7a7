-- goodput_mfu: goodput and MFU per job over time (from the per-minute rollups)
--
-- A job runs from its first step to the later of its last step and its last
-- GPU sample (a hung job keeps reporting GPUs), read on the median rank's clock
-- (a host whose clock is off does not widen it). Every bucket of that window
-- is listed, so a hang or a restart shows as buckets with little or no
-- goodput. goodput = productive rank-seconds / available rank-seconds, where
-- productive is step time minus the data and checkpoint phases and available
-- is world_size x the part of the bucket the job was running.
-- MFU = model FLOPs done / (wall seconds x GPUs x peak FLOP/s); empty when
-- the steps carry no FLOPs. peak_tflops defaults to an H100 SXM's dense BF16.
-- @param job String = ''  one job ('' = every job)
-- @param since DateTime64(3, 'UTC') = 0  buckets from this time on
-- @param bucket_minutes UInt32 = 1  bucket width in minutes
-- @param peak_tflops Float64 = 989  peak dense TFLOP/s of one GPU
-- @param limit UInt32 = 100000  rows at most
WITH
minutes AS (
    SELECT
        job_id,
        toStartOfInterval(minute, toIntervalMinute({bucket_minutes:UInt32})) AS bucket,
        min(min_step) AS min_step,
        max(max_step) AS max_step,
        sum(rank_seconds) AS rank_seconds,
        sum(data_seconds) AS data_s,
        sum(checkpoint_seconds) AS checkpoint_s,
        sum(tokens) AS tokens,
        sum(flops) AS flops,
        sum(flops_rank_steps) AS flops_rank_steps
    FROM step_rollup_1m
    WHERE ({job:String} = '' OR job_id = {job:String})
      AND minute >= toStartOfMinute({since:DateTime64(3, 'UTC')})
    GROUP BY job_id, bucket
),
spans AS (
    SELECT job_id, max(world_size) AS world_size, min(first_start) AS first_raw,
           max(last_end) AS last_raw, min(minute) AS first_minute, max(minute) AS last_minute
    FROM step_rollup_1m
    WHERE ({job:String} = '' OR job_id = {job:String})
      AND minute >= toStartOfMinute({since:DateTime64(3, 'UTC')})
    GROUP BY job_id
),
edge_ranges AS (
    -- from the rollup: the lowest step of the job's first minute, and the steps of its
    -- last minute (on any host's clock: every rank runs those step numbers)
    SELECT r.job_id AS job_id, minIf(r.min_step, r.minute = s.first_minute) AS first_lo,
           minIf(r.min_step, r.minute = s.last_minute) AS last_lo,
           maxIf(r.max_step, r.minute = s.last_minute) AS last_hi
    FROM step_rollup_1m AS r
    INNER JOIN spans AS s ON r.job_id = s.job_id
    WHERE r.minute = s.first_minute OR r.minute = s.last_minute
    GROUP BY r.job_id
),
edge_steps AS (
    -- the first 3 steps (side 0), and the last minute's steps, 1,024 at most (side 1)
    SELECT job_id, 0 AS side, arrayJoin(range(first_lo, toUInt64(first_lo + 3))) AS step
    FROM edge_ranges
    UNION ALL
    SELECT job_id, 1 AS side,
           arrayJoin(range(toUInt64(greatest(last_lo, toInt64(last_hi) - 1023)),
                           toUInt64(last_hi + 1))) AS step
    FROM edge_ranges
),
rank_rows AS (
    -- each rank's first start and last end of an edge step (over restarts), and the
    -- world size of its latest run of it; only these steps' rows, by the table's key
    SELECT job_id, step, rank, min(toFloat64(start_ts)) AS rank_start,
           max(toFloat64(end_ts)) AS rank_end, argMin(world_size, start_ts) AS first_world,
           argMax(world_size, end_ts) AS last_world
    FROM step_events
    WHERE (job_id, step) IN (SELECT job_id, step FROM edge_steps)
      AND start_ts >= toStartOfMinute({since:DateTime64(3, 'UTC')})
    GROUP BY job_id, step, rank
),
step_worlds AS (
    -- a step's first run's world size and its last run's
    SELECT job_id, step, argMin(first_world, rank_start) AS first_world,
           argMax(last_world, rank_end) AS last_world
    FROM rank_rows
    GROUP BY job_id, step
),
edges AS (
    -- the job's first start and last end on the median rank's clock: the earliest of
    -- its first steps' median starts over the ranks of their first run, the latest of
    -- its last steps' median ends over the ranks of their last run (a host whose clock
    -- is off does not widen the job; a restart on fewer ranks does not mix two runs)
    SELECT job_id, minIf(step_start, side = 0) AS first_med, maxIf(step_end, side = 1) AS last_med,
           countIf(side = 0) AS first_n, countIf(side = 1) AS last_n
    FROM
    (
        SELECT r.job_id AS job_id, x.side AS side, r.step AS step,
               quantileExactInclusiveIf(0.5)(r.rank_start, r.rank < w.first_world) AS step_start,
               quantileExactInclusiveIf(0.5)(r.rank_end, r.rank < w.last_world) AS step_end
        FROM rank_rows AS r
        INNER JOIN step_worlds AS w ON r.job_id = w.job_id AND r.step = w.step
        INNER JOIN edge_steps AS x ON r.job_id = x.job_id AND r.step = x.step
        GROUP BY r.job_id, x.side, r.step
    )
    GROUP BY job_id
),
hosts_last AS (
    SELECT job_id, host, max(ts) AS last_ts
    FROM gpu_samples
    WHERE ({job:String} = '' OR job_id = {job:String}) AND job_id != ''
      AND ts >= {since:DateTime64(3, 'UTC')}
    GROUP BY job_id, host
),
bounds AS (
    -- each end without raw rows (their TTL is shorter than the rollups'): the rollup's
    SELECT s.job_id AS job_id, s.world_size AS world_size,
           if(e.first_n = 0, s.first_raw, toDateTime64(e.first_med, 6, 'UTC')) AS job_first,
           if(e.last_n = 0, s.last_raw, toDateTime64(e.last_med, 6, 'UTC')) AS step_last
    FROM spans AS s
    LEFT JOIN edges AS e ON s.job_id = e.job_id
),
jobs AS (
    -- a hung job keeps reporting its GPUs: its end is its hosts' last GPU sample, the
    -- median over the hosts still reporting at its last step (each on its own clock)
    SELECT
        b.job_id AS job_id,
        b.world_size AS world_size,
        b.job_first AS job_first,
        greatest(b.step_last, if(g.gpu_last > b.job_first, g.gpu_last, b.step_last)) AS job_last
    FROM bounds AS b
    LEFT JOIN
    (
        SELECT h.job_id AS job_id,
               toDateTime64(quantileExactInclusive(0.5)(toFloat64(h.last_ts)), 6, 'UTC')
                   AS gpu_last
        FROM hosts_last AS h
        INNER JOIN bounds AS b ON h.job_id = b.job_id
        WHERE h.last_ts >= b.step_last - toIntervalSecond(60)
        GROUP BY h.job_id
    ) AS g ON b.job_id = g.job_id
),
steps AS (
    -- a skewed host's minutes outside the window count in the window's edge buckets
    SELECT
        m.job_id AS job_id,
        greatest(least(m.bucket,
            toDateTime(toStartOfInterval(j.job_last, toIntervalMinute({bucket_minutes:UInt32})), 'UTC')),
            toDateTime(toStartOfInterval(j.job_first, toIntervalMinute({bucket_minutes:UInt32})), 'UTC'))
            AS bucket,
        max(m.max_step) - min(m.min_step) + 1 AS steps,
        sum(m.rank_seconds) AS rank_seconds,
        sum(m.data_s) AS data_s,
        sum(m.checkpoint_s) AS checkpoint_s,
        sum(m.tokens) AS tokens,
        sum(m.flops) AS flops,
        sum(m.flops_rank_steps) AS flops_rank_steps
    FROM minutes AS m
    INNER JOIN jobs AS j ON m.job_id = j.job_id
    GROUP BY job_id, bucket
),
grid AS (
    SELECT
        job_id, world_size, job_first, job_last,
        toDateTime(toStartOfInterval(job_first, toIntervalMinute({bucket_minutes:UInt32})), 'UTC')
            + toIntervalMinute(n * {bucket_minutes:UInt32}) AS bucket
    FROM jobs
    ARRAY JOIN range(toUInt64(intDiv(dateDiff('second',
        toStartOfInterval(job_first, toIntervalMinute({bucket_minutes:UInt32})), job_last),
        60 * {bucket_minutes:UInt32}) + 1)) AS n
),
buckets AS (
    SELECT
        g.job_id AS job_id,
        g.bucket AS bucket,
        s.steps AS steps,
        g.world_size AS world_size,
        greatest(0, dateDiff('millisecond', greatest(g.bucket, g.job_first),
            least(g.bucket + toIntervalMinute({bucket_minutes:UInt32}), g.job_last)) / 1000) AS wall_s,
        s.rank_seconds - s.data_s - s.checkpoint_s AS productive,
        s.data_s AS data_s,
        s.checkpoint_s AS checkpoint_s,
        s.tokens AS tokens,
        s.flops AS flops,
        s.flops_rank_steps AS flops_rank_steps
    FROM grid AS g
    LEFT JOIN steps AS s ON g.job_id = s.job_id AND g.bucket = s.bucket
)
SELECT
    job_id,
    bucket,
    steps,
    world_size,
    round(wall_s, 3) AS wall_s,
    round(if(wall_s > 0, greatest(0, least(1, productive / (world_size * wall_s))), 0), 4) AS goodput,
    round(if(wall_s > 0, data_s / (world_size * wall_s), 0), 4) AS data_fraction,
    round(if(wall_s > 0, checkpoint_s / (world_size * wall_s), 0), 4) AS checkpoint_fraction,
    round(if(wall_s > 0, tokens / wall_s, 0), 1) AS tokens_per_s,
    if(flops_rank_steps > 0 AND wall_s > 0,
       round(flops / (wall_s * world_size * {peak_tflops:Float64} * 1e12), 4), NULL) AS mfu
FROM buckets
ORDER BY job_id, bucket
LIMIT {limit:UInt32}
