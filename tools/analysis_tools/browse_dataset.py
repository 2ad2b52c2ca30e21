"""Draw N random training samples as the model sees them (after the config's augmentation
pipeline, ground truth drawn) into a folder, with a mosaic of all of them."""
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.dataset_tool_config import config_parser, open_config
from xcit_dense.datasets.browse import browse_training_samples
from xcit_dense.tool_errors import exit_status


def main() -> None:
    parser = config_parser(__doc__)
    parser.add_argument('--num', type=int, default=16, help='how many samples (default 16)')
    parser.add_argument('--out-dir', default='browse', help='where the drawings go (default ./browse)')
    parser.add_argument('--seed', type=int, default=0, help='which samples are drawn')
    args = parser.parse_args()
    cfg = open_config(args)
    # a link at the mosaic's name stops the tool (UnsafeOutputError); at a sample's, that one is reported
    drawn = browse_training_samples(cfg, args.num, args.out_dir, args.seed)
    print(f'{len(drawn)} samples drawn into {args.out_dir} (mosaic.jpg shows them all)')


if __name__ == '__main__':
    sys.exit(exit_status(main))
