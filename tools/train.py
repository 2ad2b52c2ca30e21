"""Train a detector or segmentor from a config (the config's default_scope says which)."""
import argparse
import sys
from typing import Optional

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.engine import process_group, world_size
from xcit_dense.engine.planning.out_of_memory import explained
from xcit_dense.engine.planning.run_config import VIS_BACKENDS, assemble_training, open_training
from xcit_dense.engine.training.fine_tune import hand_load_from
from xcit_dense.engine.training.nonfinite_loss_hook import NonFiniteLossError
from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.tool_errors import exit_status, stop_on, stop_on_bad_samples


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config', help='train config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config>)')
    parser.add_argument('--resume', nargs='?', const='auto', default=None,
                        help='resume from the newest complete checkpoint of the work dir, or from '
                             'the given one')
    parser.add_argument('--amp', nargs='?', const='fp16', choices=['fp16', 'bf16'],
                        help='mixed precision (fp16 with dynamic loss scaling, or bf16)')
    parser.add_argument('--accumulation', type=int, metavar='N',
                        help='gradient accumulation steps (config: optim_wrapper.accumulative_counts)')
    parser.add_argument('--keep-total-batch', action='store_true',
                        help="accumulate as needed to reach the recipe's total batch on this hardware")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument('--scale-lr', dest='scale_lr', action='store_true', default=None,
                       help='scale the LR by effective batch / reference batch (config: auto_scale_lr.enable)')
    scale.add_argument('--no-scale-lr', dest='scale_lr', action='store_false')
    parser.add_argument('--auto-fit', action='store_true',
                        help='before the first step, probe the memory and train with fewer images per GPU and '
                             'more accumulation (same effective batch) if the planned batch does not fit '
                             '(config: auto_fit.enable)')
    parser.add_argument('--ema', nargs='?', const=0.9999, type=float, metavar='DECAY',
                        help='train an exponential moving average of the weights beside the model (decay per '
                             'optimizer step, default 0.9999), validated and saved as the checkpoint\'s weights '
                             '(config: model_ema)')
    parser.add_argument('--skip-nonfinite', action='store_true',
                        help='skip batches with a NaN/inf loss (counted in the log) instead of stopping')
    parser.add_argument('--vis-backend', action='append', choices=sorted(VIS_BACKENDS), default=[],
                        help='also log scalars to this tracker (repeatable); mlflow and wandb need '
                             'their packages')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values, e.g. train_dataloader.batch_size=4')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    return parser.parse_args()


def main() -> None:
    """The command line; ``exit_status`` turns the toolkit's errors into ``error: ...`` and their status
    (1; 3 for out of memory), a preemption into 128 + the signal number (in a multi-process run
    ``process_group`` ends the process alike)."""
    args = parse_args()
    with stop_on(ValueError, heading=f'error in {args.config}', every_rank_alike=True):
        cfg = open_training(args)
    with process_group(args.launcher) as backend:
        train(cfg, args, backend)


def train(cfg: Config, args: argparse.Namespace, backend: Optional[str]) -> None:
    """Assemble the run, build the Runner and train; the Runner is garbage once this returns.
    Raises ToolkitError (inside the process group: no exit here, see ``main``)."""
    with stop_on(ValueError), stop_on(CheckpointError, FileNotFoundError, prefix='cannot resume: '):
        run = assemble_training(cfg, args, world_size())  # (a SchemaError is a CheckpointError and a ValueError)
    runner = RUNNERS.build(cfg)
    with stop_on(CheckpointError, prefix='cannot resume: '):
        run.resume.hand_to(runner)
    if cfg.get('load_from') and not run.resume.path:
        with stop_on(CheckpointError, FileNotFoundError):
            reinitialised = hand_load_from(runner, cfg.load_from)
        runner.logger.info(f'load_from {cfg.load_from}: every weight loaded except the class-dependent '
                           f'layers left at their initial values: {", ".join(reinitialised) or "none"}')
    for line in run.plan_lines(backend, cfg.work_dir):
        runner.logger.info(line)
    # out of memory: explained (status 3); a bad validation sample stops it (the metric would be over fewer images)
    with stop_on(NonFiniteLossError, CheckpointError, log=runner.logger.error), \
            stop_on_bad_samples('validation', runner.logger.error), explained(cfg, run.plan):
        runner.train()


if __name__ == '__main__':
    sys.exit(exit_status(main))
