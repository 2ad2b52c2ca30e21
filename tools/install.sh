#!/usr/bin/env bash
# Install the xcit-dense stack into a virtual environment, compiling mmcv once.
#
# Usage: bash tools/install.sh            (idempotent; fast when nothing changed)
#
# Environment:
#   XCIT_VENV        the virtual environment to use or create (default: <repo>/.venv)
#   XCIT_PYTHON      the interpreter that creates it (default: python3.11, else python3)
#   XCIT_CACHE       where built mmcv wheels are kept and reused (default: ~/.cache/xcit-dense)
#   XCIT_MMCV_CUDA   auto (default): build mmcv's CUDA ops when a GPU and nvcc are present;
#                    1: always build them (needs nvcc); 0: CPU ops only
#   TORCH_CUDA_ARCH_LIST  CUDA architectures to compile for (default: those of the GPUs present)
#   MAX_JOBS         parallel compile jobs (default: number of cores)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${XCIT_VENV:-$ROOT/.venv}"
CACHE="${XCIT_CACHE:-$HOME/.cache/xcit-dense}"
MMCV_VERSION="$(sed -n 's/^mmcv==//p' "$ROOT/requirements/mmcv.txt")"

log() { printf '[install] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  PY="${XCIT_PYTHON:-$(command -v python3.11 || command -v python3)}"
  log "creating virtual environment $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
PYTHON="$VENV/bin/python"
# pip, minus the warnings of a machine-wide pip config whose local indexes are absent
pip_q() {
  "$PYTHON" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
}

# A stamp of every requirements file and setup.py: when it matches, nothing to do.
STAMP="$VENV/.xcit-dense-stamp"
want_stamp="$(cat "$ROOT"/requirements/*.txt "$ROOT/setup.py" | sha256sum | cut -d' ' -f1) $ROOT"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] \
   && "$PYTHON" -c "import mmcv.ops, mmdet, mmseg, xcit_dense" 2>/dev/null; then
  log "environment $VENV is up to date"
  exit 0
fi

log "installing build tools and the runtime stack (torch, mmengine, mmdet, mmseg, timm)"
pip_q install -q -r "$ROOT/requirements/build.txt"
pip_q install -q -r "$ROOT/requirements/runtime.txt"

mmcv_ok() {
  "$PYTHON" - "$MMCV_VERSION" <<'PY' 2>/dev/null
import sys
import mmcv
from mmcv.ops import nms  # noqa: F401  (fails when the compiled ops are missing)
sys.exit(0 if mmcv.__version__ == sys.argv[1] else 1)
PY
}

if mmcv_ok; then
  log "mmcv $MMCV_VERSION with compiled ops is already installed"
else
  # Decide which ops to build; the wheel cache is keyed by torch version and variant.
  read -r TORCH_VER HAS_GPU GPU_ARCHS < <("$PYTHON" - <<'PY'
import torch
gpu = torch.cuda.is_available()
archs = sorted({'%d.%d' % torch.cuda.get_device_capability(i)
                for i in range(torch.cuda.device_count())}) if gpu else []
print(torch.__version__.split('+')[0], int(gpu), ';'.join(archs) or '-')
PY
)
  CUDA_MODE="${XCIT_MMCV_CUDA:-auto}"
  case "$CUDA_MODE" in
    auto) if [ "$HAS_GPU" = 1 ] && command -v nvcc >/dev/null; then CUDA_MODE=1; else CUDA_MODE=0; fi ;;
    0|1) ;;
    *) echo "XCIT_MMCV_CUDA must be auto, 0 or 1, got '$CUDA_MODE'" >&2; exit 2 ;;
  esac
  if [ "$CUDA_MODE" = 1 ]; then
    command -v nvcc >/dev/null || { echo "XCIT_MMCV_CUDA=1 but nvcc is not on PATH" >&2; exit 2; }
    export FORCE_CUDA=1
    if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
      [ "$GPU_ARCHS" != "-" ] || { echo "no GPU visible: set TORCH_CUDA_ARCH_LIST (e.g. '8.0;9.0')" >&2; exit 2; }
      export TORCH_CUDA_ARCH_LIST="$GPU_ARCHS"
    fi
    VARIANT="cuda-$(echo "$TORCH_CUDA_ARCH_LIST" | tr -c '0-9A-Za-z.\n' '_')"
  else
    export FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=""
    VARIANT="cpu"
  fi
  WHEEL_DIR="$CACHE/wheels/mmcv-$MMCV_VERSION-torch$TORCH_VER-$VARIANT"
  WHEEL="$(ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    "$PYTHON" "$ROOT/tools/build_mmcv.py" --version "$MMCV_VERSION" --out "$WHEEL_DIR"
    WHEEL="$(ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)"
  else
    log "reusing the mmcv wheel built before: $WHEEL"
  fi
  pip_q install -q --no-deps --force-reinstall "$WHEEL"
  # mmcv's own runtime dependencies (addict, yapf, opencv, ...)
  pip_q install -q "$WHEEL"
  mmcv_ok || { echo "mmcv $MMCV_VERSION was installed but its compiled ops do not import" >&2; exit 1; }
fi

log "installing xcit-dense (editable) and the test tools"
pip_q install -q --no-build-isolation --no-deps -e "$ROOT"
pip_q install -q -r "$ROOT/requirements/tests.txt"
"$PYTHON" -c "import mmcv.ops, mmdet.models, mmseg.models, xcit_dense"
echo "$want_stamp" > "$STAMP"
log "done: $VENV"
