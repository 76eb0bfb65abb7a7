-- The remediator's audit: every decision (acted, dry-run, queued, skipped and
-- why, failed) is one row of remediation_actions (0004). The remediator writes
-- them through ClickHouse's HTTP interface (a server, or the store endpoint of
-- `stepwatch db serve --allow-writes`); status holds the outcome, reason the
-- guardrail or rule that decided. These columns say under which mode and for
-- which alert.

ALTER TABLE remediation_actions ADD COLUMN IF NOT EXISTS mode LowCardinality(String) DEFAULT '';
ALTER TABLE remediation_actions ADD COLUMN IF NOT EXISTS alertname LowCardinality(String) DEFAULT '';
ALTER TABLE remediation_actions ADD COLUMN IF NOT EXISTS cause LowCardinality(String) DEFAULT '';
ALTER TABLE remediation_actions ADD COLUMN IF NOT EXISTS alert_class LowCardinality(String) DEFAULT '';
