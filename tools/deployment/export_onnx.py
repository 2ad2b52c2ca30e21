"""Export a config's XCiT backbone (any input size) or whole model (--whole) to ONNX; a published model (a
folder of tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one) may replace CONFIG
and --checkpoint, as for tools/infer.py. Of a checkpoint trained with --ema the average is exported.

A segmentor (--whole) is exported for any input size: logits at the input's size and the label map,
with the classes, palette, normalisation and test resize in the file's metadata (tools/deployment/infer_onnx.py
runs it without torch). A Mask R-CNN (--whole) too, its whole prediction in standard ONNX operators:
boxes in the input's pixels, scores, labels and 28x28 mask probabilities (the image goes in resized and
normalised, unpadded: the graph pads it; xcit_dense/analysis/onnx_detector.py);
another detector's tensor forward for the --shape size only.
--check compares onnxruntime's outputs with PyTorch's on a random image of the --shape size or on the
images of --images DIR: a segmentor's label maps' pixel agreement and logits' largest difference; a
Mask R-CNN's detections paired by label and box IoU, their score differences, the pairs' mask IoU and
the unpaired ones. The exit status is 1 where one is beyond the tolerances.
"""
import argparse
import sys
from typing import Callable, List

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import torch

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.analysis.onnx_detector import (
    MAX_SCORE_DIFFERENCE,
    MIN_BOX_IOU,
    MIN_MASK_IOU,
    DetectorForward,
    check_detection,
)
from xcit_dense.analysis.onnx_export import (
    MAX_LOGITS_DIFFERENCE,
    MIN_PIXEL_AGREEMENT,
    SegmentorForward,
    check_segmentation,
    export_config,
    max_abs_error,
)
from xcit_dense.published import is_published_model, open_published
from xcit_dense.tool_errors import exit_status
from xcit_launch.image_names import list_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='the config, or a published model (a folder of '
                                       'tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one) '
                                       'with no --checkpoint')
    parser.add_argument('out', help='the .onnx file to write')
    parser.add_argument('--checkpoint', help="the whole model's training checkpoint (default: randomly "
                                             "initialised weights; the pretrained backbone is not loaded)")
    parser.add_argument('--trust-config', action='store_true',
                        help="a published folder: build from its config.py (executed) instead of its recipe")
    parser.add_argument('--shape', type=int, nargs=2, default=[512, 512], metavar=('H', 'W'),
                        help='the traced input size (the only one of a detector other than Mask R-CNN)')
    parser.add_argument('--whole', action='store_true', help="export the model's prediction, not the backbone")
    parser.add_argument('--check', action='store_true', help='compare with PyTorch through onnxruntime')
    parser.add_argument('--images', metavar='DIR', nargs='+',
                        help='--check of a segmentor or Mask R-CNN on these images (files or folders)')
    args = parser.parse_args()
    config, dataset_meta = args.config, None
    if is_published_model(args.config):
        if args.checkpoint:
            parser.error('a published model holds its weights: give it without --checkpoint')
        published = open_published(args.config, args.trust_config)
        config, args.checkpoint, dataset_meta = published.config, published.weights, published.dataset_meta
    elif args.trust_config:
        parser.error('--trust-config is for a published model folder')
    module = export_config(config, args.out, args.shape, args.checkpoint, args.whole, dataset_meta)
    print(f'wrote {args.out}' + ('' if args.checkpoint else ' (random weights: no --checkpoint given)'))
    if not args.check:
        return
    if isinstance(module, DetectorForward):
        check_detector(args, module)
        return
    if not args.images:
        error = max_abs_error(args.out, module, torch.rand(1, 3, *args.shape))
        print(f'largest difference onnxruntime vs PyTorch: {error:.3g}')
        return
    if not isinstance(module, SegmentorForward):
        sys.exit('error: --images checks a segmentor exported with --whole')
    try:
        rows = check_segmentation(args.out, module, list(list_inputs(args.images)))
    except (FileNotFoundError, ValueError) as exc:
        sys.exit(f'error: {exc}')
    report(rows, lambda row: f"pixels agreeing {row['pixel_agreement']:.6f}, largest logits difference "
                             f"{row['logits_difference']:.3g}",
           f'pixels agreeing >= {MIN_PIXEL_AGREEMENT}, logits within {MAX_LOGITS_DIFFERENCE}')



def check_detector(args: argparse.Namespace, module: DetectorForward) -> None:
    """--check of a Mask R-CNN: per image its paired and unpaired detections; exit 1 beyond tolerance."""
    inputs = ([(path, path) for path in list_inputs(args.images)] if args.images
              else [(f'random {args.shape[0]}x{args.shape[1]} image', None)])
    try:
        rows = check_detection(args.out, module, inputs, args.shape)
    except (FileNotFoundError, ValueError) as exc:
        sys.exit(f'error: {exc}')
    report(rows, lambda row: f"{row['matched']} detections paired, unpaired {row['unmatched'][0]} of onnxruntime "
                             f"and {row['unmatched'][1]} of PyTorch, largest score difference "
                             f"{row['score_difference']:.3g}, smallest mask IoU {row['mask_iou']:.4f}",
           f'pairs: same label, box IoU >= {MIN_BOX_IOU}; none unpaired, scores within {MAX_SCORE_DIFFERENCE}, '
           f'mask IoU >= {MIN_MASK_IOU}')


def report(rows: List[dict], figures: Callable[[dict], str], tolerances: str) -> None:
    """One line per image (its figures, marked where beyond tolerance), then the count within; exit 1
    when any image is beyond."""
    for row in rows:
        print(f"{row['image']}: {figures(row)}" + ('' if row['within'] else '  BEYOND TOLERANCE'))
    beyond = sum(not row['within'] for row in rows)
    print(f'{len(rows) - beyond} of {len(rows)} images within tolerance ({tolerances})')
    if beyond:
        sys.exit(1)


if __name__ == '__main__':
    sys.exit(exit_status(main))
