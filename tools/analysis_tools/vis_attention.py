"""Draw XCiT attention maps of a checkpoint over images.

For every chosen block and head: the d x d cross-covariance map as a heat map and the value
channels it weights most over the image. For an ImageNet classifier checkpoint of the authors
(class-attention layers present; CONFIG is then unused, pass -), also the class attention over
the patches per head. The maps themselves go to <image>_maps.npz.
"""
import argparse
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.analysis.vis_attention import visualise
from xcit_dense.tool_errors import exit_status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config of the dense model (- for a classifier checkpoint)')
    parser.add_argument('checkpoint', help='a training checkpoint, or the authors\' ImageNet weights')
    parser.add_argument('images', nargs='+', metavar='IMAGE')
    parser.add_argument('--out-dir', required=True)
    parser.add_argument('--blocks', type=int, nargs='+', help='blocks to draw (default: the last)')
    parser.add_argument('--heads', type=int, nargs='+', help='heads to draw (default: all)')
    parser.add_argument('--top-k', type=int, default=4, help='value channels drawn per head')
    parser.add_argument('--size', type=int, nargs=2, default=[448, 448], metavar=('H', 'W'),
                        help='the images are resized to H x W (default 448 448)')
    args = parser.parse_args()
    visualise(args.config, args.checkpoint, args.images, args.out_dir, args.blocks, args.heads,
              args.top_k, tuple(args.size))  # a link where it writes: UnsafeOutputError


if __name__ == '__main__':
    sys.exit(exit_status(main))
