-- Raw telemetry at full fidelity: one row per rank-step, GPU sample, port sample.
--
-- Engines: ReplacingMergeTree keyed on the natural key, which always ends with
-- (host, inst, seq) from the sending agent, so a message delivered twice
-- collapses into one row; saved queries read with FINAL. The sink inserts with
-- deterministic insert_deduplication_token values, which needs
-- non_replicated_deduplication_window on every table it writes (and on every
-- materialized-view target, so rollups are deduplicated with their source).
-- {{raw_ttl_days}} is filled in from Settings.store_raw_ttl_days.

CREATE TABLE IF NOT EXISTS step_events
(
    job_id LowCardinality(String),
    step UInt64 CODEC(DoubleDelta, ZSTD(1)),
    rank UInt32 CODEC(DoubleDelta, ZSTD(1)),
    world_size UInt32 CODEC(ZSTD(1)),
    host LowCardinality(String),
    local_rank UInt32 CODEC(ZSTD(1)),
    gpu UInt16 CODEC(ZSTD(1)),
    peer_group LowCardinality(String),
    start_ts DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    end_ts DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    duration_s Float32 CODEC(ZSTD(1)),
    data_s Nullable(Float32) CODEC(ZSTD(1)),
    forward_s Nullable(Float32) CODEC(ZSTD(1)),
    backward_s Nullable(Float32) CODEC(ZSTD(1)),
    optimizer_s Nullable(Float32) CODEC(ZSTD(1)),
    comm_wait_s Nullable(Float32) CODEC(ZSTD(1)),
    checkpoint_s Nullable(Float32) CODEC(ZSTD(1)),
    compute_s Nullable(Float32) CODEC(ZSTD(1)),
    phases_extra Map(LowCardinality(String), Float32) CODEC(ZSTD(1)),
    samples UInt64 CODEC(ZSTD(1)),
    tokens UInt64 CODEC(ZSTD(1)),
    loss Nullable(Float64) CODEC(ZSTD(1)),
    flops Nullable(Float64) CODEC(ZSTD(1)),
    timing LowCardinality(String),
    inst LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    INDEX start_minmax start_ts TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(start_ts)
ORDER BY (job_id, step, rank, host, inst, seq)
TTL toDateTime(start_ts) + INTERVAL {{raw_ttl_days}} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS gpu_samples
(
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    job_id LowCardinality(String),
    host LowCardinality(String),
    gpu UInt16,
    uuid String CODEC(ZSTD(1)),
    name LowCardinality(String),
    pci_bus_id String CODEC(ZSTD(1)),
    util_gpu_pct Nullable(Float32) CODEC(ZSTD(1)),
    util_mem_pct Nullable(Float32) CODEC(ZSTD(1)),
    fb_used_mib Nullable(Float32) CODEC(ZSTD(1)),
    fb_free_mib Nullable(Float32) CODEC(ZSTD(1)),
    temp_gpu_c Nullable(Float32) CODEC(ZSTD(1)),
    temp_mem_c Nullable(Float32) CODEC(ZSTD(1)),
    power_w Nullable(Float32) CODEC(ZSTD(1)),
    power_limit_w Nullable(Float32) CODEC(ZSTD(1)),
    energy_mj_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    sm_clock_mhz Nullable(Float32) CODEC(ZSTD(1)),
    sm_clock_max_mhz Nullable(Float32) CODEC(ZSTD(1)),
    mem_clock_mhz Nullable(Float32) CODEC(ZSTD(1)),
    throttle_reasons Nullable(UInt64) CODEC(ZSTD(1)),
    ecc_sbe_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    ecc_dbe_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    remapped_rows_correctable Nullable(UInt64) CODEC(ZSTD(1)),
    remapped_rows_uncorrectable Nullable(UInt64) CODEC(ZSTD(1)),
    remapped_rows_pending Nullable(Bool),
    pcie_replay_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    nvlink_tx_bytes_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    nvlink_rx_bytes_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    gr_engine_active Nullable(Float32) CODEC(ZSTD(1)),
    tensor_active Nullable(Float32) CODEC(ZSTD(1)),
    dram_active Nullable(Float32) CODEC(ZSTD(1)),
    xid_last Nullable(UInt32) CODEC(ZSTD(1)),
    -- computed by the sink against the previous sample of the same (host, gpu)
    dt_s Nullable(Float32) CODEC(ZSTD(1)),
    ecc_sbe_new Nullable(UInt64) CODEC(ZSTD(1)),
    ecc_dbe_new Nullable(UInt64) CODEC(ZSTD(1)),
    remapped_rows_uncorrectable_new Nullable(UInt64) CODEC(ZSTD(1)),
    pcie_replay_new Nullable(UInt64) CODEC(ZSTD(1)),
    nvlink_tx_bytes_per_s Nullable(Float64) CODEC(ZSTD(1)),
    nvlink_rx_bytes_per_s Nullable(Float64) CODEC(ZSTD(1)),
    ver UInt8,  -- 1 when the computed columns are known: the copy kept on merge
    inst LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    INDEX ts_minmax ts TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMM(ts)
ORDER BY (job_id, host, gpu, ts, inst, seq)
TTL toDateTime(ts) + INTERVAL {{raw_ttl_days}} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS port_samples
(
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    job_id LowCardinality(String),
    host LowCardinality(String),
    device LowCardinality(String),
    port UInt16,
    netdev LowCardinality(String),
    link_layer LowCardinality(String),
    state LowCardinality(String),
    phys_state LowCardinality(String),
    rate_gbps Nullable(Float32),
    xmit_bytes_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rcv_bytes_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    xmit_packets_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rcv_packets_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    xmit_wait_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    symbol_error_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    link_downed_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    link_error_recovery_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rcv_errors_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rcv_remote_physical_errors_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    xmit_discards_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    excessive_buffer_overrun_errors_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    local_link_integrity_errors_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    vl15_dropped_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    np_cnp_sent_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    np_ecn_marked_roce_packets_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rp_cnp_handled_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rp_cnp_ignored_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    out_of_sequence_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    packet_seq_err_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    implied_nak_seq_err_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    local_ack_timeout_err_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    rnr_nak_retry_err_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    duplicate_request_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    out_of_buffer_total Nullable(UInt64) CODEC(Delta, ZSTD(1)),
    -- per-second rates computed by the sink against the previous sample of the
    -- same (host, device, port), reset- and wrap-aware
    dt_s Nullable(Float32) CODEC(ZSTD(1)),
    xmit_bytes_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rcv_bytes_per_s Nullable(Float64) CODEC(ZSTD(1)),
    xmit_packets_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rcv_packets_per_s Nullable(Float64) CODEC(ZSTD(1)),
    xmit_wait_per_s Nullable(Float64) CODEC(ZSTD(1)),
    symbol_error_per_s Nullable(Float64) CODEC(ZSTD(1)),
    link_downed_per_s Nullable(Float64) CODEC(ZSTD(1)),
    link_error_recovery_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rcv_errors_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rcv_remote_physical_errors_per_s Nullable(Float64) CODEC(ZSTD(1)),
    xmit_discards_per_s Nullable(Float64) CODEC(ZSTD(1)),
    excessive_buffer_overrun_errors_per_s Nullable(Float64) CODEC(ZSTD(1)),
    local_link_integrity_errors_per_s Nullable(Float64) CODEC(ZSTD(1)),
    vl15_dropped_per_s Nullable(Float64) CODEC(ZSTD(1)),
    np_cnp_sent_per_s Nullable(Float64) CODEC(ZSTD(1)),
    np_ecn_marked_roce_packets_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rp_cnp_handled_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rp_cnp_ignored_per_s Nullable(Float64) CODEC(ZSTD(1)),
    out_of_sequence_per_s Nullable(Float64) CODEC(ZSTD(1)),
    packet_seq_err_per_s Nullable(Float64) CODEC(ZSTD(1)),
    implied_nak_seq_err_per_s Nullable(Float64) CODEC(ZSTD(1)),
    local_ack_timeout_err_per_s Nullable(Float64) CODEC(ZSTD(1)),
    rnr_nak_retry_err_per_s Nullable(Float64) CODEC(ZSTD(1)),
    duplicate_request_per_s Nullable(Float64) CODEC(ZSTD(1)),
    out_of_buffer_per_s Nullable(Float64) CODEC(ZSTD(1)),
    ver UInt8,
    inst LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    INDEX ts_minmax ts TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree(ver)
PARTITION BY toYYYYMM(ts)
ORDER BY (job_id, host, device, port, ts, inst, seq)
TTL toDateTime(ts) + INTERVAL {{raw_ttl_days}} DAY
SETTINGS non_replicated_deduplication_window = 10000;
