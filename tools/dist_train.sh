#!/usr/bin/env bash
# Train with torchrun on one node, or on node NODE_RANK of NNODES.
# Usage: [NNODES=1] [NODE_RANK=0] [MASTER_ADDR=127.0.0.1] [PORT=29500] [RDZV_TIMEOUT=600] [MAX_RESTARTS=0] \
#        [SHUTDOWN_TIMEOUT=90] \
#        bash tools/dist_train.sh CONFIG GPUS [train.py args]
# GPUS is the number of processes on this node (one per GPU; CPU processes without GPUs).
# In a Kubeflow PyTorchJob or TrainJob pod the four variables default to the job's (docs/kubernetes.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/launch_common.sh"
[ $# -ge 2 ] || die "usage: bash tools/dist_train.sh CONFIG GPUS [train.py args]"
CONFIG=$1 GPUS=$2
shift 2
require_file config "$CONFIG"
torchrun_layout
preflight train "$CONFIG" "$@"
torchrun_args
exec "$PYTHON" "$ROOT/tools/torchrun.py" "${TORCHRUN_ARGS[@]}" "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
