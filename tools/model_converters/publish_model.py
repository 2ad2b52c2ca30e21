"""Publish a trained model without pickle: a new folder OUT_DIR/<config stem>-<first 8 hex of the weights'
sha256> holding model.safetensors (the checkpoint's weights; the EMA average for a run trained with --ema),
model.json (the recipe config of configs/ the run derives from, the run's typed overrides of it, the
weights' sha256, the toolkit version, where the figures come from), a README.md model card and the run's
config as config.py (for reading; tools/test.py and tools/infer.py run it only with --trust-config).

tools/test.py FOLDER and tools/infer.py FOLDER IMAGES then use it in place of CONFIG CHECKPOINT; so does
an hf-hub:OWNER/NAME repository holding the folder's files. (Not mmdet's tool of the same name, which
writes a pickled .pth.)
"""
import argparse
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.published import publish
from xcit_dense.tool_errors import exit_status


def main() -> None:
    """The command line; ``exit_status`` turns the toolkit's errors into ``error: ...`` and status 1."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='the training checkpoint (work_dirs/<run>/iter_N.pth, epoch_N.pth)')
    parser.add_argument('out_dir', help='where the new folder is made')
    parser.add_argument('--config', help="the run's config (default: the one .py file beside the checkpoint); "
                                         "its _base_ chain must reach a config of configs/")
    args = parser.parse_args()
    folder = publish(args.checkpoint, args.out_dir, args.config)
    print(f'published {folder}: model.safetensors, model.json, README.md, config.py')


if __name__ == '__main__':
    sys.exit(exit_status(main))
