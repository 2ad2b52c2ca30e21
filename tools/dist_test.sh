#!/usr/bin/env bash
# Evaluate a checkpoint with torchrun (same environment variables as dist_train.sh).
# Usage: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
[ $# -ge 3 ] || die "usage: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args]"
CONFIG=$1 CHECKPOINT=$2 GPUS=$3
shift 3
require_file config "$CONFIG"
require_checkpoint "$CHECKPOINT"
torchrun_layout
preflight test "$CONFIG" "$@"
torchrun_args
exec "$PYTHON" "$ROOT/tools/torchrun.py" "${TORCHRUN_ARGS[@]}" "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
