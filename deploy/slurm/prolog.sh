#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/stepwatch-prolog.sh), runs as root on each
# node before the job. Job attribution for GPU telemetry before the first step arrives
# and for jobs without the step SDK: one file per allocated GPU index, holding the job id,
# in the hpc-job mapping directory (the format dcgm-exporter's --hpc-job-mapping-dir reads,
# which labels its series hpc_job). Also makes sure the agent runs. Never fails the job.
set -u
MAP_DIR="${STEPWATCH_JOB_MAP_DIR:-/run/stepwatch/jobs}"
JOB="${SLURM_JOB_ID:-}"
[ -n "$JOB" ] || exit 0

if command -v systemctl >/dev/null 2>&1 && [ -z "${STEPWATCH_PROLOG_NO_SYSTEMD:-}" ]; then
    systemctl is-active --quiet stepwatch-agent || systemctl start stepwatch-agent || true
fi

mkdir -p "$MAP_DIR" 2>/dev/null || exit 0
# SLURM_JOB_GPUS: comma-separated GPU indexes of this node's allocation (gres/gpu)
IFS=',' read -r -a gpus <<< "${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
for gpu in "${gpus[@]}"; do
    case "$gpu" in
        ''|*[!0-9]*) continue ;;
    esac
    printf '%s\n' "$JOB" > "$MAP_DIR/$gpu.tmp" && mv -f "$MAP_DIR/$gpu.tmp" "$MAP_DIR/$gpu"
done
exit 0
