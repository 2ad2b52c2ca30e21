#!/usr/bin/env bash
# Install the xcit-dense stack into a virtual environment, from wheels: nothing is compiled.
#
# Usage: bash tools/install.sh            (idempotent; fast when nothing changed)
#
# By default mmcv is mmcv-lite (mmcv's pure-Python wheel) and its compiled-ops module mmcv._ext is
# this toolkit's xcit_mmcv_ext, on torchvision's CPU and CUDA kernels: one install for CPUs and GPUs.
# XCIT_MMCV=compiled compiles mmcv with all its ops instead (once; the wheel is cached).
#
# Environment:
#   XCIT_VENV        the virtual environment to use or create (default: <repo>/.venv)
#   XCIT_PYTHON      the interpreter that creates it (default: python3.11, else python3)
#   XCIT_MMCV        lite (default): mmcv-lite and the toolkit's mmcv._ext; compiled: mmcv built with its ops
#   XCIT_TORCH       torch and torchvision requirements instead of the ranges of requirements/runtime.txt and
#                    the pins of requirements/constraints.txt,
#                    e.g. XCIT_TORCH='torch==2.15.0 torchvision==0.29.2' (the newest on PyPI; untested by CI)
#   XCIT_CONSTRAINTS the pip constraints file (default: requirements/constraints.txt, the set CI tests);
#                    an empty file installs the newest releases the ranges allow (dev/check_install_range.sh)
# The stack is installed from requirements/runtime.txt's ranges with requirements/constraints.txt's
# versions (the set CI tests) as pip constraints.
# With XCIT_MMCV=compiled only:
#   XCIT_CACHE       where built mmcv wheels are kept and reused (default: ~/.cache/xcit-dense)
#   XCIT_MMCV_CUDA   auto (default): build mmcv's CUDA ops when a GPU is visible;
#                    1: always build them (no GPU needed); 0: CPU ops only
#   TORCH_CUDA_ARCH_LIST  CUDA architectures to compile for, e.g. "8.0;9.0" (default: the GPUs present)
#   MAX_JOBS         parallel compile jobs (default: number of cores)
# The CUDA compiler is the system's when torch accepts it, else NVIDIA's PyPI one installed into
# the virtual environment (see tools/misc/build_mmcv.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${XCIT_VENV:-$ROOT/.venv}"
CACHE="${XCIT_CACHE:-$HOME/.cache/xcit-dense}"
MMCV_VERSION="$(sed -n 's/^mmcv==//p' "$ROOT/requirements/mmcv.txt")"
MMCV="${XCIT_MMCV:-lite}"

log() { printf '[install] %s\n' "$*"; }
case "$MMCV" in
  lite|compiled) ;;
  *) log "XCIT_MMCV must be lite or compiled, got '$MMCV'"; exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  PY="${XCIT_PYTHON:-$(command -v python3.11 || command -v python3)}"
  log "creating virtual environment $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
PYTHON="$VENV/bin/python"
# the runtime requirements and the tested versions, with XCIT_TORCH's torch and torchvision in place of theirs
RUNTIME="$ROOT/requirements/runtime.txt"
CONSTRAINTS="${XCIT_CONSTRAINTS:-$ROOT/requirements/constraints.txt}"
[ -f "$CONSTRAINTS" ] || { log "no constraints file $CONSTRAINTS"; exit 2; }
if [ -n "${XCIT_TORCH:-}" ]; then
  RUNTIME="$(mktemp)"
  TESTED="$CONSTRAINTS"
  CONSTRAINTS="$(mktemp)"
  trap 'rm -f "$RUNTIME" "$CONSTRAINTS"' EXIT
  grep -vE '^(torch|torchvision)([=<>!~ ;]|$)' "$ROOT/requirements/runtime.txt" > "$RUNTIME"
  grep -vE '^(torch|torchvision)([=<>!~ ;]|$)' "$TESTED" > "$CONSTRAINTS" || true  # none left: an empty file
  for requirement in $XCIT_TORCH; do echo "$requirement" >> "$RUNTIME"; done
fi
# pip, minus the warnings of a machine-wide pip config whose local indexes are absent
pip_q() {
  "$PYTHON" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
}

# A stamp of every requirements file, setup.py, the mmcv kind and its build settings: when it matches,
# nothing to do. For compiled mmcv under XCIT_MMCV_CUDA=auto it records the GPUs torch sees too: an
# install made where none was visible (CPU ops only), run again on a GPU node, rebuilds mmcv with its
# CUDA ops. mmcv-lite's install is the same on CPUs and GPUs.
STAMP="$VENV/.xcit-dense-stamp"
stamp() {
  local s
  s="$(cat "$ROOT"/requirements/*.txt "$ROOT/setup.py" | sha256sum | cut -d' ' -f1) $ROOT mmcv=$MMCV"
  s+="${XCIT_TORCH:+ torch=$XCIT_TORCH}${XCIT_CONSTRAINTS:+ constraints=$(sha256sum < "$XCIT_CONSTRAINTS" | cut -c1-16)}"
  [ "$MMCV" = compiled ] || { echo "$s"; return; }
  s+="${XCIT_MMCV_CUDA:+ cuda=$XCIT_MMCV_CUDA}${TORCH_CUDA_ARCH_LIST:+ archs=$TORCH_CUDA_ARCH_LIST}"
  if [ "${XCIT_MMCV_CUDA:-auto}" = auto ]; then
    s+=" gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' \
      2>/dev/null || echo unknown)"
  fi
  echo "$s"
}
want_stamp="$(stamp)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] \
   && "$PYTHON" -c "import mmcv.ops, mmdet, mmseg, xcit_dense" 2>/dev/null; then
  log "environment $VENV is up to date"
  exit 0
fi

# mmcv-lite and compiled mmcv are two distributions of one folder (mmcv/): uninstalling either
# after installing the other would delete files of both, so the other goes first.
installed() { "$PYTHON" -m pip show -q "$1" >/dev/null 2>&1; }
# The installed modules' bytecode, on every core: pip compiles the files it installs one at a time
# (about 70 of the 165 s of the stack's install on 2 cores, against 43 s here). Compiled now, not at
# the first import, because an environment with PYTHONDONTWRITEBYTECODE set would compile the modules
# again in every process (an import of the stack: 17 s without bytecode, 6.5 s with). Files that are
# not Python 3 (some packages ship templates or old examples as .py) fail to compile, as under pip.
compile_bytecode() {
  local site
  site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  "$PYTHON" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
}
if [ "$MMCV" = lite ]; then
  if installed mmcv; then
    log "removing compiled mmcv (XCIT_MMCV=compiled installs it again)"
    pip_q uninstall -q -y mmcv
  fi
  # one resolution for everything: pip's start and resolve are a large part of an install from wheels
  log "installing the stack (torch, mmengine, mmdet, mmseg, timm, mmcv-lite $MMCV_VERSION) and the test tools"
  pip_q install -q --no-compile -r "$ROOT/requirements/build.txt" -r "$RUNTIME" -c "$CONSTRAINTS" \
    "mmcv-lite==$MMCV_VERSION" -r "$ROOT/requirements/tests.txt"
  compile_bytecode
else
  log "installing build tools and the runtime stack (torch, mmengine, mmdet, mmseg, timm)"
  pip_q install -q -r "$ROOT/requirements/build.txt"
  pip_q install -q -r "$RUNTIME" -c "$CONSTRAINTS"
  if installed mmcv-lite; then
    log "removing mmcv-lite"
    pip_q uninstall -q -y mmcv-lite
  fi
  # The wheel to install: found in the cache or compiled (prints nothing when mmcv already fits).
  BUILD_MMCV=("$PYTHON" "$ROOT/tools/misc/build_mmcv.py" --version "$MMCV_VERSION" --cache "$CACHE")
  WHEEL="$("${BUILD_MMCV[@]}")"
  if [ -n "$WHEEL" ]; then
    pip_q install -q --no-deps --force-reinstall "$WHEEL"
    # mmcv's own runtime dependencies (addict, yapf, opencv, ...)
    pip_q install -q "$WHEEL"
    "${BUILD_MMCV[@]}" --check
  fi
  pip_q install -q -r "$ROOT/requirements/tests.txt"
fi

log "installing xcit-dense (editable; with mmcv-lite it serves mmcv._ext)"
pip_q install -q --no-build-isolation --no-deps -e "$ROOT"
# a fresh interpreter that imports mmcv's ops without the toolkit, as mmdet's own tools do, beside one
# that imports the toolkit
"$PYTHON" -c "import mmcv.ops, mmdet.models, mmseg.models" & stock=$!
"$PYTHON" -c "import xcit_dense"
wait "$stock"
stamp > "$STAMP"  # torch is installed now: its GPU count is known
log "done: $VENV"
