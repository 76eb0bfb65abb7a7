-- ingest_completeness: are all sent messages stored exactly once?
--
-- Per sender (host, inst, kind): messages stored (distinct seq), the seq range,
-- missing sequence numbers (gaps) and rows present more than once before
-- deduplication. Dead-lettered messages count as received (in_dead_letters).
-- seq is gap-free per (host, inst, kind) at the sender, so gaps = 0 and
-- stored + in_dead_letters = max_seq + 1 mean nothing was lost.
-- @param since DateTime64(3, 'UTC') = -1d  rows from this time on
-- @param limit UInt32 = 1000  rows at most
WITH received AS (
    SELECT host, inst, 'step' AS kind, seq, count() AS n FROM step_events
    WHERE start_ts >= {since:DateTime64(3, 'UTC')} GROUP BY host, inst, seq, rank, step
    UNION ALL
    SELECT host, inst, 'gpu', seq, count() FROM gpu_samples
    WHERE ts >= {since:DateTime64(3, 'UTC')} GROUP BY host, inst, seq, gpu
    UNION ALL
    SELECT host, inst, 'port', seq, count() FROM port_samples
    WHERE ts >= {since:DateTime64(3, 'UTC')} GROUP BY host, inst, seq, device, port
    UNION ALL
    SELECT host, inst, 'event', seq, count() FROM events
    WHERE ts >= {since:DateTime64(3, 'UTC')} GROUP BY host, inst, seq
    UNION ALL
    SELECT host, inst, 'detection', seq, count() FROM detections
    WHERE ts >= {since:DateTime64(3, 'UTC')} GROUP BY host, inst, seq
),
dead AS (
    SELECT host, inst, kind, uniqExact(seq) AS in_dead_letters
    FROM dead_letters
    WHERE received_at >= {since:DateTime64(3, 'UTC')} AND seq IS NOT NULL
    GROUP BY host, inst, kind
)
SELECT
    r.host AS host, r.inst AS inst, r.kind AS kind,
    r.stored AS stored, d.in_dead_letters AS in_dead_letters,
    r.min_seq AS min_seq, r.max_seq AS max_seq,
    toInt64(r.max_seq) - toInt64(r.min_seq) + 1 - toInt64(r.stored) AS gaps,
    r.duplicate_rows AS duplicate_rows
FROM
(
    SELECT host, inst, kind, uniqExact(seq) AS stored, min(seq) AS min_seq, max(seq) AS max_seq,
           sum(n - 1) AS duplicate_rows
    FROM received
    GROUP BY host, inst, kind
) AS r
LEFT JOIN dead AS d ON r.host = d.host AND r.inst = d.inst AND r.kind = d.kind
ORDER BY gaps DESC, duplicate_rows DESC, host, inst, kind
LIMIT {limit:UInt32}
