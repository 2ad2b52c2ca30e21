"""Evaluate a checkpoint (COCO bbox/segm mAP or mIoU, as the config says); optionally save
the predictions (--out), draw them (--show-dir), or test with the config's test-time augmentation
(--tta: multi-scale and flip for the ADE20K configs). CONFIG CHECKPOINT may be replaced by a published
model alone (a folder of tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one:
xcit_dense/published.py)."""
import argparse
import os
import sys
from contextlib import nullcontext
from typing import Optional

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
from mmengine.config import DictAction
from mmengine.registry import RUNNERS

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.engine import process_group
from xcit_dense.engine.distributed.process_group import describe_topology
from xcit_dense.engine.planning.run_config import EvaluationRun, assemble_testing, open_testing
from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.output_files import writing
from xcit_dense.tool_errors import exit_status, stop_on, stop_on_bad_samples


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config', help='test config file, or a published model (a folder of '
                                       'tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one) '
                                       'given alone')
    parser.add_argument('checkpoint', nargs='?', help="checkpoint file (.pth, .safetensors), https URL or hf-hub:"
                                                      "OWNER/NAME (this toolkit's or the authors' released models)")
    parser.add_argument('--trust-config', action='store_true',
                        help="a published folder: build from its config.py (executed) instead of its recipe")
    parser.add_argument('--work-dir', help='where the evaluation log goes (default: work_dirs/<config>)')
    parser.add_argument('--out', help='save the raw predictions to this .pkl file')
    parser.add_argument('--show-dir', help='draw predictions (with ground truth) into this folder')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation: the config's tta_pipeline and tta_model")
    parser.add_argument('--raw-weights', action='store_true',
                        help='a checkpoint trained with --ema: evaluate the trained weights, not their average')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values, e.g. test_dataloader.batch_size=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    return parser.parse_args()


def main() -> None:
    """The command line; ``exit_status`` turns the toolkit's errors into ``error: ...`` and their status
    (in a multi-process run ``process_group`` ends the process alike)."""
    args = parse_args()
    with stop_on(ValueError, CheckpointError, every_rank_alike=True):
        run = open_testing(args)  # the checkpoint read once: evaluate takes it out (none kept here)
    with process_group(args.launcher) as backend:
        evaluate(run, args, backend)


def evaluate(run: EvaluationRun, args: argparse.Namespace, backend: Optional[str]) -> None:
    """Build the Runner and test on the checkpoint (handed to the Runner, which drops it once loaded), the
    --out pickle written through no link: in a private folder, renamed into place once the test ends (a
    link at its name refused before the test starts); the Runner is garbage once this returns. Raises
    ToolkitError (inside the process group: no exit here, see ``main``)."""
    with writing(os.path.abspath(args.out)) if args.out else nullcontext() as out:
        assemble_testing(run, args, out)
        runner = RUNNERS.build(run.cfg)
        with stop_on(CheckpointError, ValueError):
            run.checkpoint.hand_to(runner)
        runner.logger.info(f'Test plan: {describe_topology(backend)}')
        with stop_on_bad_samples('test', runner.logger.error):  # the metric would be over fewer images
            runner.test()


if __name__ == '__main__':
    sys.exit(exit_status(main))
