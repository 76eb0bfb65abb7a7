-- Detection fields of the v1 contract additions: where a network fault is
-- (NIC device and port), the ranks a host-level incident touches, and the id
-- of the incident a linked detection belongs to (docs/detection.md).

ALTER TABLE detections ADD COLUMN IF NOT EXISTS device LowCardinality(String) DEFAULT '' AFTER host;
ALTER TABLE detections ADD COLUMN IF NOT EXISTS port Nullable(UInt16) AFTER device;
ALTER TABLE detections ADD COLUMN IF NOT EXISTS ranks Array(UInt32) AFTER port;
ALTER TABLE detections ADD COLUMN IF NOT EXISTS related String DEFAULT '' AFTER ranks;
