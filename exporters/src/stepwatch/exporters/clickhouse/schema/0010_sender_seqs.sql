-- Which (host, inst, kind, seq) the sink has accepted, and with what content.
--
-- One row per accepted message (not per row), written by the sink after the
-- message's rows. Before inserting a batch the sink looks the batch's sender
-- numbers up here: a number already accepted with the same content is a
-- duplicate (dropped), with other content a seq_conflict (dead-lettered, not
-- inserted), so the first content accepted stays what FINAL and the rollups
-- read, across sink restarts and past the in-memory window (docs/store.md).
-- key: a 40-bit hash of (host, inst, kind) followed by the low 24 bits of
-- seq, computed by the sink (accepted.py): a lookup asks for plain integers
-- (a list of tuples is slow to parse) and a sender's numbers still sort and
-- compress together; the sink keeps only rows whose four columns match.
-- digest: 64-bit BLAKE2b of the message (senders.content_digest); rows with
-- the same number and another digest are kept side by side (the key ends with
-- it), so a lookup sees every content the store holds for a number.
-- Kept as long as the raw tables keep rows ({{raw_ttl_days}}, adjusted with
-- them), counted from acceptance.

CREATE TABLE IF NOT EXISTS sender_seqs
(
    key UInt64 CODEC(Delta, ZSTD(1)),
    host LowCardinality(String),
    inst LowCardinality(String),
    kind LowCardinality(String),
    seq UInt64 CODEC(Delta, ZSTD(1)),
    digest UInt64 CODEC(ZSTD(1)),
    accepted_at DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(accepted_at)
ORDER BY (key, digest)
TTL toDateTime(accepted_at) + INTERVAL {{raw_ttl_days}} DAY
SETTINGS non_replicated_deduplication_window = 10000;
