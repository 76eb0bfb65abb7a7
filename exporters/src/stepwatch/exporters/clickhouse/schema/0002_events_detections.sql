-- Discrete events and detections: small, valuable, kept without TTL.

CREATE TABLE IF NOT EXISTS events
(
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    job_id LowCardinality(String),
    host LowCardinality(String),
    type LowCardinality(String),
    rank Nullable(UInt32),
    gpu Nullable(UInt16),
    device LowCardinality(String),
    port Nullable(UInt16),
    code Nullable(Int64),
    detail String CODEC(ZSTD(1)),
    attrs Map(String, String) CODEC(ZSTD(1)),
    inst LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (job_id, ts, host, inst, seq)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS detections
(
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    id String,
    job_id LowCardinality(String),
    type LowCardinality(String),
    state LowCardinality(String),
    rank Nullable(UInt32),
    gpu Nullable(UInt16),
    peer_group LowCardinality(String),
    cause LowCardinality(String),
    fault LowCardinality(String),
    score Nullable(Float64),
    step Nullable(UInt64),
    first_step Nullable(UInt64),
    opened_at Nullable(DateTime64(3, 'UTC')),
    summary String CODEC(ZSTD(1)),
    evidence Map(String, String) CODEC(ZSTD(1)),
    subject_host LowCardinality(String),  -- the flagged host, when the detection names one
    host LowCardinality(String),          -- the message header's host (flagged host or 'stepwatch')
    inst LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (job_id, ts, id, host, inst, seq)
SETTINGS non_replicated_deduplication_window = 10000;
