-- goodput_mfu: goodput and MFU per job over time (from the per-minute rollups)
--
-- A job runs from its first step to the later of its last step and its last
-- GPU sample (a hung job keeps reporting GPUs). Every bucket of that window
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
steps AS (
    SELECT
        job_id,
        toStartOfInterval(minute, toIntervalMinute({bucket_minutes:UInt32})) AS bucket,
        max(max_step) - min(min_step) + 1 AS steps,
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
jobs AS (
    SELECT
        s.job_id AS job_id,
        s.world_size AS world_size,
        s.job_first AS job_first,
        greatest(s.step_last, if(g.gpu_last > s.job_first, g.gpu_last, s.step_last)) AS job_last
    FROM
    (
        SELECT job_id, max(world_size) AS world_size, min(first_start) AS job_first,
               max(last_end) AS step_last
        FROM step_rollup_1m
        WHERE ({job:String} = '' OR job_id = {job:String})
          AND minute >= toStartOfMinute({since:DateTime64(3, 'UTC')})
        GROUP BY job_id
    ) AS s
    LEFT JOIN
    (
        SELECT job_id, toDateTime64(max(ts), 6, 'UTC') AS gpu_last
        FROM gpu_samples
        WHERE ({job:String} = '' OR job_id = {job:String}) AND job_id != ''
          AND ts >= {since:DateTime64(3, 'UTC')}
        GROUP BY job_id
    ) AS g ON s.job_id = g.job_id
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
