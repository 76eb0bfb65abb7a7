-- StepRecord.cpu_time and cpu_wait (contract v1 additions): seconds the rank's
-- training thread ran on a CPU, and waited for one (Linux run-queue delay),
-- during the step. NULL: not measured. A larger waiting share than the peers'
-- tells CPU contention on a host apart from slower compute (docs/detection.md).

ALTER TABLE step_events ADD COLUMN IF NOT EXISTS cpu_time_s Nullable(Float32) CODEC(ZSTD(1)) AFTER timing;
ALTER TABLE step_events ADD COLUMN IF NOT EXISTS cpu_wait_s Nullable(Float32) CODEC(ZSTD(1)) AFTER cpu_time_s;
