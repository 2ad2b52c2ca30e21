"""Export a config's XCiT backbone (any input size) or whole model (--whole, one size) to ONNX.

--check compares onnxruntime's outputs with PyTorch's on a random image of the given size.
"""
import argparse
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import torch

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.analysis.onnx_export import export_config, max_abs_error
from xcit_dense.errors import UnsafeOutputError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config')
    parser.add_argument('out', help='the .onnx file to write')
    parser.add_argument('--checkpoint', help="the whole model's training checkpoint (default: randomly "
                                             "initialised weights; the pretrained backbone is not loaded)")
    parser.add_argument('--shape', type=int, nargs=2, default=[512, 512], metavar=('H', 'W'))
    parser.add_argument('--whole', action='store_true', help="export the model's tensor forward, not the backbone")
    parser.add_argument('--check', action='store_true', help='compare with PyTorch through onnxruntime')
    args = parser.parse_args()
    try:
        module = export_config(args.config, args.out, args.shape, args.checkpoint, args.whole)
    except UnsafeOutputError as exc:
        sys.exit(f'error: {exc}')
    print(f'wrote {args.out}' + ('' if args.checkpoint else ' (random weights: no --checkpoint given)'))
    if args.check:
        error = max_abs_error(args.out, module, torch.rand(1, 3, *args.shape))
        print(f'largest difference onnxruntime vs PyTorch: {error:.3g}')


if __name__ == '__main__':
    main()
