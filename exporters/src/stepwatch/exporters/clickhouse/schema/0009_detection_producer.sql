-- The stream worker that produced each detection (contract v1 addition
-- ``producer``: the worker's name, default host:pid). The sink can refuse
-- detections from producers outside an allow-list (docs/security.md, "Boundary 2").

ALTER TABLE detections ADD COLUMN IF NOT EXISTS producer LowCardinality(String) DEFAULT '' AFTER related;
