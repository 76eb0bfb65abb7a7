#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/stepwatch-epilog.sh), runs as root on each
# node after the job: removes this job's GPU mapping files (only those still naming it, so
# a next job's prolog is never undone). Never fails.
set -u
MAP_DIR="${STEPWATCH_JOB_MAP_DIR:-/run/stepwatch/jobs}"
JOB="${SLURM_JOB_ID:-}"
[ -n "$JOB" ] && [ -d "$MAP_DIR" ] || exit 0
for file in "$MAP_DIR"/*; do
    [ -f "$file" ] || continue
    if [ "$(head -n 1 "$file" 2>/dev/null)" = "$JOB" ]; then
        rm -f "$file"
    fi
done
exit 0
