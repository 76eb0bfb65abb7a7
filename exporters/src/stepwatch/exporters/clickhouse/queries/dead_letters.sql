-- dead_letters: what the sink refused to store, and why
--
-- reason is the contract's (malformed_json, schema, unknown_kind,
-- unsupported_version, absurd_value, overflow, too_large), the sink's checks'
-- (wrong_topic, future_timestamp, too_old, duplicate_record, seq_conflict,
-- unknown_producer) or the store's (overflow, invalid_value, rejected_by_store,
-- internal_error): docs/store.md; detail says which field; payload is the record
-- as sent.
-- @param since DateTime64(3, 'UTC') = -7d  rows received from this time on
-- @param limit UInt32 = 100  rows at most
SELECT received_at, reason, topic, partition, offset, kind, host, inst, seq, detail,
       substring(payload, 1, 200) AS payload_head
FROM dead_letters FINAL
WHERE received_at >= {since:DateTime64(3, 'UTC')}
ORDER BY received_at DESC, topic, partition, offset
LIMIT {limit:UInt32}
