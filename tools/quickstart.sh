#!/usr/bin/env bash
# Install the stack if needed (see tools/install.sh), then run the main job, the demo:
# generate the demo data if missing, train XCiT-T12/16 Mask R-CNN from scratch with PROCS processes
# (tools/dist_train.sh; default 2, or 1 where torch sees one GPU or the node has one core), evaluate it (COCO bbox/segm mAP), draw its predictions on validation
# images and plot the training curves. `bash tools/quickstart.sh seg` (what
# tools/quickstart_seg.sh runs) does the same for UperNet with mIoU.
# A repeat resumes from the work dir's checkpoint: a finished training is not run again.
# PORT: the rendezvous port (default: a free one).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TASK="${1:-det}"
case "$TASK" in
  det) CONFIG=configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py WORK=work_dirs/demo_mask_rcnn
       DATA=coco VAL_IMAGES=data/demo_coco/val ;;
  seg) CONFIG=configs/demo/upernet_xcit_tiny_12_p16_demo.py WORK=work_dirs/demo_upernet
       DATA=ade VAL_IMAGES=data/demo_ade/images/validation ;;
  *) echo "usage: bash tools/quickstart.sh [det|seg]" >&2; exit 2 ;;
esac
bash "$ROOT/tools/install.sh"
export PYTHON="${XCIT_VENV:-$ROOT/.venv}/bin/python"
cd "$ROOT"
export PORT="${PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

source "$ROOT/tools/launch_common.sh"  # node_gpus: the GPUs torch sees
if [ -z "${PROCS:-}" ]; then
  gpus="$(node_gpus)"
  if [ "$gpus" -gt 0 ]; then PROCS=$(( gpus < 2 ? gpus : 2 )); else PROCS=$(( $(nproc) < 2 ? 1 : 2 )); fi
fi
require_positive_int PROCS "$PROCS"

start=$SECONDS
step() { echo "[demo] $* ($((SECONDS - start)) s)"; }
step "1/5 demo data"
"$PYTHON" tools/make_demo_data.py --only "$DATA"
step "2/5 training $CONFIG with $PROCS process(es)"
bash tools/dist_train.sh "$CONFIG" "$PROCS" --work-dir "$WORK" --resume
CHECKPOINT="$(cat "$WORK/last_checkpoint")"
step "3/5 evaluating $CHECKPOINT"
bash tools/dist_test.sh "$CONFIG" "$CHECKPOINT" "$PROCS" --work-dir "$WORK/eval" 2>&1 | tee "$WORK/eval.log"
trained=$SECONDS
step "4/5 predictions on validation images"
"$PYTHON" tools/infer.py "$CONFIG" "$CHECKPOINT" "$VAL_IMAGES" --limit 16 \
  --out-dir "$WORK/predictions" --mosaic "$WORK/predictions.png"
step "5/5 training curves"
"$PYTHON" tools/analysis_tools/plot_logs.py "$WORK" --out "$WORK/curves.png"
echo "[demo] done in $((SECONDS - start)) s (data, training and evaluation: $((trained - start)) s)"
grep -hE 'bbox_mAP_copypaste|segm_mAP_copypaste|\| +(aAcc|mIoU)|mIoU:' "$WORK/eval.log" | tail -n 3 || true
echo "[demo] pictures: $WORK/predictions.png (and $WORK/predictions/), curves: $WORK/curves.png"
