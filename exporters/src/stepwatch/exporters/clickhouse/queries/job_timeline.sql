-- job_timeline: a job's events, detections, alerts and actions, in time order
--
-- The job's own events (start, checkpoints, restarts, exceptions, end), the
-- host-level events (XID, ECC, link changes) of the hosts the job ran on while
-- it ran, every detection state change (open, update, resolved) with its
-- cause and fault class, every alert state change Alertmanager sent (firing
-- at its start, resolved at its end; host-level alerts of the job's hosts
-- while it ran) and every remediation decision (source 'action': what, the
-- outcome, why). One time axis: source says which kind a row is. A detection
-- that names a rank only gets the host the rank ran on when it opened (after a
-- requeue, the allocation of that time).
-- @param job String  the job
-- @param limit UInt32 = 10000  rows at most
WITH
    (SELECT min(first_seen) - toIntervalMinute(10) FROM rank_placement WHERE job_id = {job:String}) AS t0,
    (SELECT max(last_seen) + toIntervalHour(1) FROM rank_placement WHERE job_id = {job:String}) AS t1
SELECT ts, source, what, host, rank, gpu, device, port, code, cause, detail
FROM
(
    SELECT ts, 'event' AS source, toString(type) AS what, toString(host) AS host, rank, gpu,
           toString(device) AS device, port, code, '' AS cause, detail
    FROM events FINAL
    WHERE job_id = {job:String}
       OR (job_id = '' AND ts BETWEEN t0 AND t1
           AND host IN (SELECT host FROM rank_placement WHERE job_id = {job:String}))
    UNION ALL
    SELECT d.ts AS ts, 'detection' AS source, concat(d.type, ':', d.state) AS what,
           if(d.subject_host != '', toString(d.subject_host), toString(p.host)) AS host,
           d.rank AS rank, d.gpu AS gpu, toString(d.device) AS device, d.port AS port,
           CAST(NULL, 'Nullable(Int64)') AS code, concat(d.cause, '/', d.fault) AS cause,
           if(empty(d.ranks), d.summary,
              concat(d.summary, ' [ranks ', arrayStringConcat(arrayMap(x -> toString(x), d.ranks), ','), ']')) AS detail
    FROM detections AS d FINAL
    LEFT JOIN
    (
        -- where the rank ran when the detection opened (a requeued rank has a placement
        -- per allocation): of its placements started by then, the one running then (or
        -- that ran last), the latest to start
        SELECT q.rank AS rank, q.at AS at,
               argMax(r.host, (r.first_seen <= q.at, least(q.at, r.last_seen), r.first_seen)) AS host
        FROM
        (
            SELECT DISTINCT rank, ifNull(opened_at, ts) AS at FROM detections
            WHERE job_id = {job:String} AND rank IS NOT NULL
        ) AS q
        INNER JOIN
        (
            SELECT rank, host, min(first_seen) AS first_seen, max(last_seen) AS last_seen
            FROM rank_placement WHERE job_id = {job:String} GROUP BY rank, host
        ) AS r ON q.rank = r.rank
        GROUP BY rank, at
    ) AS p ON d.rank = p.rank AND ifNull(d.opened_at, d.ts) = p.at
    WHERE d.job_id = {job:String}
    UNION ALL
    SELECT if(status = 'resolved', ifNull(ends_at, received_at), starts_at) AS ts, 'alert' AS source,
           concat(alertname, ':', status) AS what, toString(host) AS host,
           CAST(NULL, 'Nullable(UInt32)') AS rank, CAST(NULL, 'Nullable(UInt16)') AS gpu,
           labels['device'] AS device, CAST(NULL, 'Nullable(UInt16)') AS port,
           CAST(NULL, 'Nullable(Int64)') AS code, labels['cause'] AS cause,
           concat(if(annotations['summary'] != '', annotations['summary'], alertname),
                  ' [', severity, ', fingerprint ', fingerprint, ']') AS detail
    FROM alerts FINAL
    WHERE job_id = {job:String}
       OR (job_id = '' AND starts_at BETWEEN t0 AND t1
           AND host IN (SELECT host FROM rank_placement WHERE job_id = {job:String}))
    UNION ALL
    SELECT ts, 'action' AS source, concat(action, ':', status) AS what, toString(host) AS host,
           CAST(NULL, 'Nullable(UInt32)') AS rank, CAST(NULL, 'Nullable(UInt16)') AS gpu,
           '' AS device, CAST(NULL, 'Nullable(UInt16)') AS port, CAST(NULL, 'Nullable(Int64)') AS code,
           toString(cause) AS cause,
           concat(reason, if(detail != '', concat(': ', detail), ''), ' [', mode, ', alert ',
                  alertname, ']') AS detail
    FROM remediation_actions FINAL
    WHERE job_id = {job:String}
)
ORDER BY ts, source, what
LIMIT {limit:UInt32}
