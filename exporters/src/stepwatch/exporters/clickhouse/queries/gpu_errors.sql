-- gpu_errors: GPUs with rising ECC, row-remap, PCIe-replay or XID counts
--
-- ECC and remap counters are cumulative per GPU; the sink stores each
-- sample's increase (reset-aware), summed here over the window. XIDs come
-- from XID events (not dcgm-exporter's last-XID gauge). action follows
-- NVIDIA's XID guidance: 48/79/95/uncorrectable ECC -> drain, 94/63/64 ->
-- restart the application then reset, 13/31/43 -> usually the application.
-- @param since DateTime64(3, 'UTC') = -7d  samples and events from this time on
-- @param job String = ''  one job ('' = all)
-- @param limit UInt32 = 50  rows at most
WITH
xids AS (
    SELECT host AS x_host, toUInt16(assumeNotNull(gpu)) AS x_gpu,
           count() AS xid_events, arraySort(groupUniqArray(assumeNotNull(code))) AS xid_codes,
           max(ts) AS last_xid
    FROM events FINAL
    WHERE type = 'xid' AND gpu IS NOT NULL AND code IS NOT NULL
      AND ts >= {since:DateTime64(3, 'UTC')} AND ({job:String} = '' OR job_id = {job:String})
    GROUP BY x_host, x_gpu
),
counters AS (
    SELECT host AS c_host, gpu AS c_gpu,
           sum(ifNull(ecc_sbe_new, 0)) AS ecc_sbe_new,
           sum(ifNull(ecc_dbe_new, 0)) AS ecc_dbe_new,
           sum(ifNull(remapped_rows_uncorrectable_new, 0)) AS remapped_new,
           sum(ifNull(pcie_replay_new, 0)) AS pcie_replay_new,
           max(ifNull(remapped_rows_pending, false)) AS remap_pending
    FROM gpu_samples FINAL
    WHERE ts >= {since:DateTime64(3, 'UTC')} AND ({job:String} = '' OR job_id = {job:String})
    GROUP BY c_host, c_gpu
)
SELECT
    if(c_host != '', c_host, x_host) AS host,
    if(c_host != '', c_gpu, x_gpu) AS gpu,
    xid_events, xid_codes, ecc_sbe_new, ecc_dbe_new, remapped_new, pcie_replay_new, remap_pending,
    if(xid_events > 0, toString(last_xid), '') AS last_xid,
    multiIf(hasAny(xid_codes, [48, 79, 95]) OR ecc_dbe_new > 0 OR remapped_new > 0, 'drain',
            hasAny(xid_codes, [74, 119, 120]), 'reset_gpu',
            hasAny(xid_codes, [63, 64, 94]) OR remap_pending, 'restart_app_then_reset',
            hasAny(xid_codes, [13, 31, 43]), 'check_application',
            'watch') AS action
FROM counters
FULL OUTER JOIN xids ON c_host = x_host AND c_gpu = x_gpu
WHERE xid_events > 0 OR ecc_sbe_new > 0 OR ecc_dbe_new > 0 OR remapped_new > 0 OR pcie_replay_new > 0
ORDER BY action = 'drain' DESC, ecc_dbe_new + xid_events DESC, ecc_sbe_new DESC, host, gpu
LIMIT {limit:UInt32}
