#!/usr/bin/env bash
# Install the stack if needed (see tools/install.sh), then run the test suite.
# Extra arguments go to pytest, e.g. bash tools/run_tests.sh -k backbone
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/install.sh"
VENV="${XCIT_VENV:-$ROOT/.venv}"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest tests -q -p no:cacheprovider "$@"
