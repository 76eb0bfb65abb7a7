#!/bin/bash
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/stepwatch-task-prolog.sh), runs as the
# user before each task; lines "export NAME=VALUE" on stdout go into the task's environment.
# The step SDK then finds the agent's socket and names the job by Slurm's id.
echo "export STEPWATCH_AGENT_SOCKET=${STEPWATCH_AGENT_SOCKET:-/run/stepwatch/agent.sock}"
echo "export STEPWATCH_JOB_ID=${SLURM_JOB_ID:-}"
