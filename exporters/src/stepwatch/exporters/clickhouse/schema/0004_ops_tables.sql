-- Operations: the dead-letter table, the sink's batch plan, and the alert and
-- remediation history later issues write.

CREATE TABLE IF NOT EXISTS dead_letters
(
    received_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    topic LowCardinality(String),
    partition UInt32,
    offset UInt64 CODEC(Delta, ZSTD(1)),
    kafka_key String CODEC(ZSTD(1)),
    reason LowCardinality(String),
    detail String CODEC(ZSTD(3)),
    payload String CODEC(ZSTD(3)),
    kind LowCardinality(String),
    host LowCardinality(String),
    inst LowCardinality(String),
    seq Nullable(UInt64)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(received_at)
ORDER BY (topic, partition, offset, reason)
TTL toDateTime(received_at) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- One row per planned sink batch, written before the batch's inserts: after a
-- crash the restarted sink cuts its first batches at exactly these offsets, so
-- their insert_deduplication_token values repeat and ClickHouse drops the
-- copies (see docs/store.md).
CREATE TABLE IF NOT EXISTS sink_batches
(
    consumer_group LowCardinality(String),
    topic LowCardinality(String),
    partition UInt32,
    first_offset UInt64,
    last_offset UInt64,
    messages UInt32,
    planned_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (consumer_group, topic, partition, first_offset)
TTL toDateTime(planned_at) + INTERVAL 14 DAY;

CREATE TABLE IF NOT EXISTS alerts
(
    received_at DateTime64(3, 'UTC'),
    fingerprint String,
    alertname LowCardinality(String),
    status LowCardinality(String),
    severity LowCardinality(String),
    starts_at DateTime64(3, 'UTC'),
    ends_at Nullable(DateTime64(3, 'UTC')),
    job_id LowCardinality(String),
    host LowCardinality(String),
    labels Map(String, String),
    annotations Map(String, String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(starts_at)
ORDER BY (alertname, fingerprint, starts_at, status)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS remediation_actions
(
    ts DateTime64(3, 'UTC'),
    id String,
    action LowCardinality(String),
    status LowCardinality(String),
    dry_run Bool,
    job_id LowCardinality(String),
    host LowCardinality(String),
    detection_id String,
    alert_fingerprint String,
    reason String,
    detail String,
    actor LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (ts, id, status)
SETTINGS non_replicated_deduplication_window = 10000;
