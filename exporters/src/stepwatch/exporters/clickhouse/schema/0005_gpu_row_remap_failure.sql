-- A GPU with no spare row left for remapping needs replacing (NVML
-- nvmlDeviceGetRemappedRows "failure occurred", DCGM ROW_REMAP_FAILURE): the
-- contract's GpuReading.remapped_rows_failure, stored per sample.

ALTER TABLE gpu_samples ADD COLUMN IF NOT EXISTS remapped_rows_failure Nullable(Bool) AFTER remapped_rows_pending;
