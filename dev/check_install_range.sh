#!/usr/bin/env bash
# Check the ends of the ranges in requirements/runtime.txt (setup.py's install_requires), which CI
# does not run: CI tests requirements/constraints.txt's exact set only.
#
# Usage: bash dev/check_install_range.sh [lowest] [newest]      (default: both)
#
# lowest  every requirement at its lower bound (`name>=X,...` read as `name==X`: each lower bound
#         names a release that exists on PyPI), through tools/install.sh with that constraints file
# newest  what pip picks from the ranges without constraints: the newest release each range allows
# For each: a fresh virtual environment (python3.11) made by tools/install.sh with XCIT_VENV and
# XCIT_CONSTRAINTS; the quick tests and the tests of the version-sensitive paths (VERSION_TESTS);
# then `pip install .` and `pip install -e .` of the checkout, which must keep the environment's torch
# (neither end is CI's torch; pip's lines about torch are printed). The environments are removed at
# the end.
#
# A developer's tool, not CI's: each environment downloads torch and its NVIDIA wheels (about 5 GB
# from PyPI) and the whole check takes most of an hour on two cores.
#
# Environment:
#   XCIT_RANGE_DIR  where the environments and logs go (default: a new temporary folder)
#   KEEP=1          keep the environments
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${XCIT_RANGE_DIR:-$(mktemp -d -t xcit-range-XXXXXX)}"
mkdir -p "$WORK"
SETS=("$@")
[ ${#SETS[@]} -gt 0 ] || SETS=(lowest newest)
# the paths where the stack's versions matter: DDP's options in a two-process training run, torch's
# serialization (checkpoint save, checked read, resume), timm's XCiT, torchvision's ops, inductor
VERSION_TESTS=(
  tests/integration/test_launch.py::test_two_pods_train_together_stop_on_sigterm_and_resume
  tests/integration/test_resume.py::test_an_automatic_resume_reads_the_checkpoint_once  # MMEngine < 0.10.3 fails
  tests/unit/test_checkpoint_loading.py
  tests/unit/test_checkpoint_security.py
  tests/unit/test_rng_state.py
  tests/unit/test_timm_equivalence.py
  tests/unit/test_mmcv_ext_nms.py
  tests/unit/test_mmcv_ext_roi_align.py
  tests/unit/test_compile.py
)
# ONNX export fails on torch 2.6 with the tested onnxscript (docs/install.md): checked at the newest end

log() { printf '[range] %s\n' "$*"; }
status=0
for set in "${SETS[@]}"; do
  venv="$WORK/$set"
  constraints="$WORK/$set-constraints.txt"
  case "$set" in
    lowest) sed -n 's/^\([A-Za-z0-9_.-]*\)>=\([^,;# ]*\).*/\1==\2/p' "$ROOT/requirements/runtime.txt" > "$constraints" ;;
    newest) : > "$constraints" ;;
    *) log "unknown set '$set' (lowest or newest)"; exit 2 ;;
  esac
  log "$set: installing into $venv with constraints: $(tr '\n' ' ' < "$constraints")"
  start=$SECONDS
  XCIT_VENV="$venv" XCIT_CONSTRAINTS="$constraints" bash "$ROOT/tools/install.sh"
  log "$set: installed in $((SECONDS - start)) s"
  "$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(torch|torchvision|mmengine|mmdet|mmsegmentation|mmcv-lite|timm|numpy|pycocotools|faster-coco-eval|tensorboard|nvidia-ml-py|ftfy|regex|onnx|onnxscript) ' \
    | tee "$WORK/$set-versions.txt"
  for tests in quick version; do
    start=$SECONDS
    if [ "$tests" = quick ]; then selection=(tests -m quick); else selection=("${VERSION_TESTS[@]}"); fi
    if [ "$tests" = version ] && [ "$set" = newest ]; then selection+=(tests/unit/test_onnx_export.py); fi
    (cd "$ROOT" && "$venv/bin/python" -m pytest "${selection[@]}" -q -p no:cacheprovider -rfEs) \
      || { status=1; log "$set: $tests tests FAILED"; }
    log "$set: $tests tests took $((SECONDS - start)) s"
  done
  # pip builds a non-editable install in the source folder (build/): it is given a copy of the checkout
  source="$WORK/source"
  rm -rf "$source" && mkdir -p "$source"
  (cd "$ROOT" && git ls-files --cached --others --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$source"
  before="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  for kind in copy editable; do  # the editable one last: the environment is then as install.sh made it
    if [ "$kind" = copy ]; then target=("$source"); else target=(-e "$ROOT"); fi
    log "$set: pip install ${target[*]} (torch $before installed)"
    "$venv/bin/python" -m pip install --disable-pip-version-check "${target[@]}" 2>&1 \
      | grep -E '^(Requirement already satisfied: torch|Collecting torch|Successfully installed|ERROR)' || true
    after="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
    if [ "$after" = "$before" ]; then
      log "$set: pip install ${target[*]} kept torch $after"
    else
      log "$set: pip install ${target[*]} REPLACED torch $before by $after"
      status=1
    fi
  done
done
if [ "${KEEP:-0}" = 1 ]; then
  log "environments kept in $WORK"
else
  rm -rf "$WORK"
fi
exit $status
