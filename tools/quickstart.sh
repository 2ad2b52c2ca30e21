#!/usr/bin/env bash
# Install the stack if needed (see tools/install.sh), then run the main job: a smoke run that
# builds Mask R-CNN and UperNet on an XCiT backbone and runs one image through each.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/install.sh"
VENV="${XCIT_VENV:-$ROOT/.venv}"
cd "$ROOT"
exec "$VENV/bin/python" tools/smoke.py "$@"
