#!/usr/bin/env bash
# The segmentation demo: install if needed, then generate the data if missing, train XCiT-T12/16
# UperNet from scratch with 2 processes, evaluate it (mIoU), draw its predictions on validation
# images and plot the training curves (see tools/quickstart.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/quickstart.sh" seg
