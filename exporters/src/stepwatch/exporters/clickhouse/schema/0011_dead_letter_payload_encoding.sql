-- A dead letter's payload as sent, byte for byte: valid UTF-8 is kept as text
-- (payload_encoding 'utf-8'), anything else as base64 ('base64'), as the stream
-- worker's dead letters keep it. Before, the sink decoded every payload as
-- UTF-8 with replacement characters: the bytes 00 FF were stored as 00 EF BF BD
-- and could not be recovered. payload_truncated: the payload was longer than
-- the 1 MiB the row keeps. Rows written before this migration read as 'utf-8'
-- and not truncated (their replacement characters stay).

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS payload_encoding LowCardinality(String) DEFAULT 'utf-8' AFTER seq;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS payload_truncated Bool DEFAULT false AFTER payload_encoding;
