-- StepRecord.cpu_wait (contract v1 addition): seconds the rank's training thread
-- waited for a CPU during the step (Linux run-queue delay). NULL: not measured.
-- It tells CPU contention on a host apart from slower compute (docs/detection.md).

ALTER TABLE step_events ADD COLUMN IF NOT EXISTS cpu_wait_s Nullable(Float32) CODEC(ZSTD(1)) AFTER timing;
