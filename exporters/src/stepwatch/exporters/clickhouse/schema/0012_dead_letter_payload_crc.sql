-- A dead letter's identity includes its payload: payload_crc is the CRC-32 of the
-- record's value as read from Kafka (the whole value, also when the payload
-- column keeps only its first 1 MiB). The sort key was (topic, partition,
-- offset, reason), so a dead letter of a log whose offsets were reused (a
-- re-created topic, a development broker restarted without its log, a log
-- truncated by an unclean leader election) replaced the older one at that
-- offset on merge, and the first bad record was lost. The same record read
-- again (the sink's replay after a crash) has the same CRC and still collapses.
-- ClickHouse accepts a column in the sort key only in the ALTER that adds it,
-- without a default: rows written before this migration read 0.

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS payload_crc UInt32 AFTER payload_truncated, MODIFY ORDER BY (topic, partition, offset, reason, payload_crc);
