-- port_findings: one finding per NIC port, however many jobs saw it
--
-- Network detections from the counters alone (network_congestion,
-- link_errors) and job slowdowns localized to a port name the host, device
-- and port. A port congested or erroring in several jobs is a fact about the
-- port (or the switch port behind it), not about each job: this query folds
-- every such detection into one row per port, with the jobs it touched, the
-- detection types and causes seen, and when it was first and last reported.
-- Linked detections (a job slowdown that is a congestion's cost) count
-- among the detections, not as another job. Rows whose jobs >= 2 are the
-- fabric's repeat offenders.
-- @param since DateTime64(3, 'UTC') = -7d  detections opened from this time on
-- @param min_jobs UInt32 = 1  jobs a port must have been reported in
-- @param limit UInt32 = 50  rows at most
SELECT
    subject_host AS host,
    device,
    port,
    uniqExact(job_id) AS jobs,
    uniqExact(id) AS detections,
    arraySort(groupUniqArray(type)) AS types,
    arraySort(groupUniqArray(cause)) AS causes,
    min(ifNull(opened_at, ts)) AS first_seen,
    max(ts) AS last_seen,
    round(max(ifNull(score, 0)), 3) AS max_score,
    arraySort(groupUniqArray(job_id)) AS job_ids
FROM detections FINAL
WHERE ts >= {since:DateTime64(3, 'UTC')}
  AND state = 'open'
  AND device != '' AND port IS NOT NULL AND subject_host != ''
  AND type IN ('network_congestion', 'link_errors', 'job_slowdown', 'straggler')
GROUP BY host, device, port
HAVING jobs >= {min_jobs:UInt32}
ORDER BY jobs DESC, detections DESC, last_seen DESC, host, device, port
LIMIT {limit:UInt32}
