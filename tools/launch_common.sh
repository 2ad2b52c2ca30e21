# Shared by the launch scripts (sourced, not run): interpreter choice and argument checks.
# PYTHON: the interpreter to use (default: the repository's .venv, else python3 on PATH).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

die() { echo "error: $*" >&2; exit 2; }

require_file() {  # require_file WHAT PATH
  [ -f "$2" ] || die "$1 file not found: $2"
}

require_checkpoint() {  # require_checkpoint PATH_OR_URL: a URL is downloaded by test.py (download.py)
  [[ "$1" == *://* ]] || require_file checkpoint "$1"
}

require_positive_int() {  # require_positive_int NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

# GPUs this node's processes see, counted as torch counts them (0 without a driver); unlike
# nvidia-smi this obeys CUDA_VISIBLE_DEVICES. On a CPU-only node each "GPU" is one process.
node_gpus() {
  "$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null \
    || echo 0
}

require_devices() {  # require_devices COUNT NODE_GPUS (node_gpus' count)
  if [ "$2" -gt 0 ]; then
    [ "$1" -le "$2" ] || die "GPUS=$1 but this node has $2 GPU(s)"
  else
    local cores; cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"  # nproc obeys both
    [ "$1" -le "$cores" ] || die "GPUS=$1 processes but this node has no GPU and only $cores CPU cores"
  fi
}

require_port() {  # require_port NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]{0,4}$ ]] && [ "$2" -le 65535 ] || die "$1 must be a port number (1-65535), got '$2'"
}

preflight() {  # preflight train|test CONFIG [tool args]: one message and exit 2 if the run cannot start
  "$PYTHON" "$ROOT/tools/preflight.py" "$@" || exit 2
}

# Sets NNODES / NODE_RANK / MASTER_ADDR / PORT for a torchrun launch of GPUS processes on this node:
# the user's variables, else a Kubeflow PyTorchJob's or TrainJob's (xcit_launch/launch_layout.py,
# which also refuses values that disagree), else 1 / 0 / 127.0.0.1 / 29500; logs one line naming
# where each came from (LAYOUT_LINE, printed by torchrun_args, after the preflight's checks, when a
# job gave a value). Node 0 checks that the port is free when the master is this machine.
# The user's values are checked by their form first: a wrong one fails before anything starts Python.
torchrun_layout() {
  require_positive_int GPUS "$GPUS"
  [ -z "${NNODES:-}" ] || require_positive_int NNODES "$NNODES"
  [ -z "${PORT:-}" ] || require_port PORT "$PORT"
  if [ -n "${NODE_RANK:-}" ] && [ -n "${NNODES:-}" ]; then
    [[ "$NODE_RANK" =~ ^[0-9]+$ && "$NODE_RANK" -lt "$NNODES" ]] \
      || die "NODE_RANK must be in 0..$((NNODES - 1)), got '$NODE_RANK'"
  fi
  RDZV_TIMEOUT=${RDZV_TIMEOUT:-600} SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-90}
  require_positive_int RDZV_TIMEOUT "$RDZV_TIMEOUT"
  require_positive_int SHUTDOWN_TIMEOUT "$SHUTDOWN_TIMEOUT"
  [ -z "${MAX_RESTARTS:-}" ] || [[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] \
    || die "MAX_RESTARTS must be a non-negative integer, got '$MAX_RESTARTS'"
  local gpus layout; gpus="$(node_gpus)"
  require_devices "$GPUS" "$gpus"
  layout="$("$PYTHON" "$ROOT/tools/launch_layout.py" "$GPUS" "$gpus")" || exit 2
  { read -r LAYOUT_LINE; read -r NNODES; read -r NODE_RANK; read -r MASTER_ADDR; read -r PORT; read -r MAX_RESTARTS
  } <<<"$layout"
}

# The torchrun options (TORCHRUN_ARGS) after torchrun_layout. RDZV_TIMEOUT: seconds the rendezvous
# waits for all NNODES nodes (default 600), then stops naming it. MAX_RESTARTS=N (default: an
# elastic policy's PET_MAX_RESTARTS, else 0): the agents restart the whole group up to N times after
# a failure (c10d rendezvous at MASTER_ADDR:PORT, node 0 hosting it, RDZV_ID default xcit-PORT); the
# restarted group resumes from the newest complete checkpoint by itself. SHUTDOWN_TIMEOUT (default
# 90): seconds torchrun gives its workers after a SIGTERM to write their checkpoint and exit, before
# it kills them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, read by the torchrun of torch releases that have
# --shutdown-timeout; older ones keep 30 s). The largest recipe's checkpoint (UperNet XCiT-M24/8 with
# its AdamW state, 1.26 GB) took 11-13 s to write on the 2-core development machine: 90 s leaves
# room for a slower shared volume and the step under way.
# torchrun takes any option not given from PET_<OPTION>: the operators' variables, whose values the
# layout now holds, are removed so that an elastic policy's rendezvous or PET_STANDALONE cannot
# override it. OMP_NUM_THREADS: torchrun's own rule, applied here so that torchrun prints no banner
# about it: one OpenMP thread per process when it starts several and the variable is unset (a single
# process keeps torch's default, all the cores it may use).
torchrun_args() {
  unset PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE PET_MASTER_ADDR PET_MASTER_PORT PET_STANDALONE \
    PET_RDZV_BACKEND PET_RDZV_ENDPOINT PET_RDZV_ID PET_RDZV_CONF PET_MAX_RESTARTS
  [ "$GPUS" -eq 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="$SHUTDOWN_TIMEOUT"
  [ -z "$LAYOUT_LINE" ] || echo "$LAYOUT_LINE"
  TORCHRUN_ARGS=(--nnodes="$NNODES" --nproc_per_node="$GPUS")
  if [ "$MAX_RESTARTS" -gt 0 ]; then
    # a fresh store for each round (the agents' shared one keeps the keys of the failed round)
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
    TORCHRUN_ARGS+=(--max-restarts="$MAX_RESTARTS" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$PORT"
      --rdzv-id="${RDZV_ID:-xcit-$PORT}" --rdzv-conf="join_timeout=$RDZV_TIMEOUT,is_host=$(( NODE_RANK == 0 ))")
  else
    TORCHRUN_ARGS+=(--node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="$PORT"
      --rdzv-conf="timeout=$RDZV_TIMEOUT")
  fi
}

# Checks GPUS / GPUS_PER_NODE / CPUS_PER_TASK (with the original scripts' defaults) and sets
# TASKS_PER_NODE: one Slurm task per GPU, several nodes when GPUS > GPUS_PER_NODE.
slurm_layout() {
  GPUS=${GPUS:-8} GPUS_PER_NODE=${GPUS_PER_NODE:-8} CPUS_PER_TASK=${CPUS_PER_TASK:-5}
  require_positive_int GPUS "$GPUS"
  require_positive_int GPUS_PER_NODE "$GPUS_PER_NODE"
  require_positive_int CPUS_PER_TASK "$CPUS_PER_TASK"
  TASKS_PER_NODE=$(( GPUS < GPUS_PER_NODE ? GPUS : GPUS_PER_NODE ))
  [ $(( GPUS % TASKS_PER_NODE )) -eq 0 ] || die "GPUS=$GPUS is not a multiple of GPUS_PER_NODE=$GPUS_PER_NODE"
  [ -z "${PORT:-}" ] || require_port PORT "$PORT"
  split_srun_args
  command -v srun >/dev/null || die "srun not found: is this a Slurm login node?"
  # PORT: the rendezvous port; unset, each job derives its own from the job id (engine/distributed/process_group.py)
}

# SRUN_EXTRA: the words of SRUN_ARGS, split as a shell would split quoted words but never globbed
# or expanded (a '*' stays a '*'), e.g. SRUN_ARGS="--exclude=node3 --comment='a b'".
split_srun_args() {
  SRUN_EXTRA=()
  [ -n "${SRUN_ARGS:-}" ] || return 0
  "$PYTHON" -c 'import shlex, sys; shlex.split(sys.argv[1])' "$SRUN_ARGS" 2>/dev/null \
    || die "SRUN_ARGS cannot be split into words (an unbalanced quote?): $SRUN_ARGS"
  mapfile -d '' -t SRUN_EXTRA < <("$PYTHON" -c \
    'import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))' "$SRUN_ARGS")
}
