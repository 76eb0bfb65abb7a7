-- network_hotspots: NIC ports with errors, link drops or congestion
--
-- From the sink's per-second rates (reset- and wrap-aware) times the sample
-- interval: counts of symbol errors, link downs and error recoveries, receive
-- errors and discards; ECN-marked packets and CNPs (RoCE congestion);
-- xmit_wait (ticks with data queued but not sent). congestion_ratio is the
-- larger of the port's mean xmit_wait rate and its ECN+CNP count, each over
-- the median of all ports in the window: congestion stands out from the
-- fleet's background of marks, it is not their mere presence.
-- @param since DateTime64(3, 'UTC') = -7d  samples from this time on
-- @param job String = ''  one job's samples ('' = all)
-- @param min_congestion_ratio Float64 = 5  congestion_ratio from which a port is listed
-- @param limit UInt32 = 50  rows at most
SELECT
    host, device, port, netdev, samples,
    link_downs, down_samples, symbol_errors, link_recoveries, rcv_errors, xmit_discards,
    ecn_marked, cnp, round(xmit_wait_per_s_avg, 1) AS xmit_wait_per_s_avg,
    round(xmit_wait_per_s_max, 1) AS xmit_wait_per_s_max,
    round(greatest(
        xmit_wait_per_s_avg / greatest(1, median(xmit_wait_per_s_avg) OVER ()),
        (ecn_marked + cnp) / greatest(1, median(ecn_marked + cnp) OVER ())), 2) AS congestion_ratio,
    multiIf(link_downs > 0 OR down_samples > 0, 'link_down',
            symbol_errors + rcv_errors + link_recoveries > 0, 'link_errors',
            congestion_ratio >= {min_congestion_ratio:Float64}, 'congestion',
            xmit_discards > 0, 'discards', '') AS problem
FROM
(
    SELECT
        host, device, port,
        any(netdev) AS netdev,
        count() AS samples,
        round(sum(ifNull(link_downed_per_s * dt_s, 0))) AS link_downs,
        countIf(state != '' AND state NOT LIKE '%ACTIVE%') AS down_samples,
        round(sum(ifNull(symbol_error_per_s * dt_s, 0))) AS symbol_errors,
        round(sum(ifNull(link_error_recovery_per_s * dt_s, 0))) AS link_recoveries,
        round(sum(ifNull((ifNull(rcv_errors_per_s, 0) + ifNull(rcv_remote_physical_errors_per_s, 0)
            + ifNull(local_link_integrity_errors_per_s, 0)) * dt_s, 0))) AS rcv_errors,
        round(sum(ifNull(xmit_discards_per_s * dt_s, 0))) AS xmit_discards,
        round(sum(ifNull(np_ecn_marked_roce_packets_per_s * dt_s, 0))) AS ecn_marked,
        round(sum(ifNull((ifNull(np_cnp_sent_per_s, 0) + ifNull(rp_cnp_handled_per_s, 0)) * dt_s, 0))) AS cnp,
        avg(ifNull(xmit_wait_per_s, 0)) AS xmit_wait_per_s_avg,
        max(ifNull(xmit_wait_per_s, 0)) AS xmit_wait_per_s_max
    FROM port_samples FINAL
    WHERE ts >= {since:DateTime64(3, 'UTC')} AND ({job:String} = '' OR job_id = {job:String})
    GROUP BY host, device, port
)
QUALIFY problem != ''
ORDER BY problem = 'link_down' DESC, link_downs + symbol_errors + rcv_errors DESC,
         congestion_ratio DESC, ecn_marked + cnp DESC, host, device, port
LIMIT {limit:UInt32}
