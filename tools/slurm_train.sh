#!/usr/bin/env bash
# Train under Slurm: one task per GPU, several nodes when GPUS > GPUS_PER_NODE; the master is the
# first host of SLURM_NODELIST.
# REQUEUE=1: submit a batch job (sbatch --requeue --wait) instead of running srun from here; when a
# node of the job fails, Slurm requeues it and the new attempt resumes from the newest complete
# checkpoint. Its output is appended to SLURM_OUTPUT (default slurm-%j.out, %j the job id). The job
# asks for SIGUSR1 SIGNAL_LEAD seconds (default 180) before its time limit, sent to the training
# processes (the job's steps, not the batch shell: --signal without B:), which then checkpoint,
# requeue the job and exit; Slurm may send it up to 60 s earlier still.
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] [PORT=20000+jobid%10000] \
#        [REQUEUE=1 [SLURM_OUTPUT=...] [SIGNAL_LEAD=180]] \
#        bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
[ $# -ge 3 ] || die "usage: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args]"
PARTITION=$1 JOB_NAME=$2 CONFIG=$3
shift 3
WORK_DIR=()
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then WORK_DIR=(--work-dir "$1"); shift; fi
require_file config "$CONFIG"
[ "${REQUEUE:-0}" = 0 ] || [ "${REQUEUE}" = 1 ] || die "REQUEUE must be 0 or 1, got '$REQUEUE'"
SIGNAL_LEAD=${SIGNAL_LEAD:-180}
require_positive_int SIGNAL_LEAD "$SIGNAL_LEAD"
slurm_layout
preflight train "$CONFIG" "$@"
if [ "${REQUEUE:-0}" = 1 ] && [ -z "${SLURM_JOB_ID:-}" ]; then
  # the batch script runs this script again inside the allocation, where the srun below starts the step
  command -v sbatch >/dev/null || die "sbatch not found: is this a Slurm login node?"
  exec sbatch --wait --requeue --signal=USR1@"$SIGNAL_LEAD" --partition="$PARTITION" --job-name="$JOB_NAME" --nodes=$(( GPUS / TASKS_PER_NODE )) \
    --ntasks="$GPUS" --ntasks-per-node="$TASKS_PER_NODE" --gres=gpu:"$TASKS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" --output="${SLURM_OUTPUT:-slurm-%j.out}" --open-mode=append \
    --wrap="$(printf '%q ' bash "$ROOT/tools/slurm_train.sh" "$PARTITION" "$JOB_NAME" "$CONFIG" "${WORK_DIR[@]}" "$@")"
fi
exec srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$TASKS_PER_NODE" --ntasks="$GPUS" \
  --ntasks-per-node="$TASKS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 \
  "${SRUN_EXTRA[@]}" "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" "${WORK_DIR[@]}" --launcher slurm "$@"
