#!/usr/bin/env bash
# Evaluate a checkpoint under Slurm (same environment variables as slurm_train.sh).
# Usage: bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
[ $# -ge 4 ] || die "usage: bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args]"
PARTITION=$1 JOB_NAME=$2 CONFIG=$3 CHECKPOINT=$4
shift 4
require_file config "$CONFIG"
require_checkpoint "$CHECKPOINT"
slurm_layout
preflight test "$CONFIG" "$@"
exec srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$TASKS_PER_NODE" --ntasks="$GPUS" \
  --ntasks-per-node="$TASKS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 \
  "${SRUN_EXTRA[@]}" "$PYTHON" -u "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher slurm "$@"
