"""Train a detector or segmentor from a config (the config's default_scope says which)."""
import argparse
import os
import sys
from pathlib import Path
from typing import Optional

import xcit_dense  # noqa: F401  (first: it silences the stack's known warnings before mmengine loads)
from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS

from xcit_dense.builder import load_config
from xcit_dense.data_files import check_data_files
from xcit_dense.engine import (apply_batch_plan, check_mmcv_cuda_arch, process_group, resolve_batch_plan,
                               world_size)
from xcit_dense.checkpoint import (CheckpointError, allow_mmengine_checkpoints, check_matches_model,
                                   find_resumable_checkpoint)
from xcit_dense.engine.dist import describe_topology, exit_once_per_node, restart
from xcit_dense.engine.hooks import NonFiniteLossError
from xcit_dense.models.weights import check_finetune_fits
from xcit_dense.datasets.problems import bad_sample_message
from xcit_dense.engine.run_config import (VIS_BACKENDS, adapt_to_machine, add_vis_backends, check_samples,
                                          configure_amp, configure_training_hooks, seed_from_checkpoint)
from xcit_dense.tasks import task_of_config


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
    args = parse_args()
    if not os.path.isfile(args.config):
        sys.exit(f'error: config file not found: {args.config}')
    allow_mmengine_checkpoints()
    try:
        check_mmcv_cuda_arch()  # a GPU outside the installed mmcv build: say so before any kernel fails
    except RuntimeError as exc:
        exit_once_per_node(f'error: {exc}')
    try:
        cfg = load_config(args.config, args.cfg_options)
        check_data_files(cfg)
        task_of_config(cfg).import_models()  # before the Runner does: a segmentation run keeps mmdet out
    except ValueError as exc:
        exit_once_per_node(f'error in {args.config}: {exc}')
    cfg.launcher = args.launcher
    with process_group(args.launcher) as backend:
        train(cfg, args, backend)


def train(cfg: Config, args: argparse.Namespace, backend: Optional[str]) -> None:
    """Plan the batch, build the Runner and train; the Runner is garbage once this returns."""
    try:
        plan = resolve_batch_plan(cfg, world_size(), args.accumulation, args.keep_total_batch,
                                  args.scale_lr)
    except ValueError as exc:
        sys.exit(f'error: {exc}')
    apply_batch_plan(cfg, plan)
    adapt_to_machine(cfg)
    configure_amp(cfg, args.amp)
    add_vis_backends(cfg, args.vis_backend)
    configure_training_hooks(cfg, plan.as_dict(), args.skip_nonfinite)
    check_samples(cfg, ['train_dataloader', 'val_dataloader'])
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or str(Path('work_dirs') / Path(args.config).stem)

    resume_from = None
    restarted, restarted_by = restart()
    try:
        if restarted:  # torchrun or Slurm started the group again after a failure: continue where it was
            newest = find_resumable_checkpoint(cfg.work_dir) if os.path.isdir(cfg.work_dir) else None
            args.resume = newest or args.resume or 'auto'
        if args.resume == 'auto':
            resume_from = find_resumable_checkpoint(cfg.work_dir) if os.path.isdir(cfg.work_dir) else None
        elif args.resume:
            resume_from = args.resume
        if resume_from:
            cfg.resume, cfg.load_from = True, resume_from
            seed_from_checkpoint(cfg, resume_from)
        elif cfg.get('load_from'):
            cfg.model.backbone.init_cfg = None  # the checkpoint holds every backbone weight (checked below)
        runner = RUNNERS.build(cfg)
        if resume_from:
            check_matches_model(runner.model, resume_from)
    except (CheckpointError, FileNotFoundError) as exc:
        sys.exit(f'error: cannot resume: {exc}')
    if cfg.get('load_from') and not resume_from:
        try:
            reinitialised = check_finetune_fits(runner.model, cfg.load_from)
        except (CheckpointError, FileNotFoundError) as exc:
            sys.exit(f'error: {exc}')
        runner.logger.info(f'load_from {cfg.load_from}: every weight loaded except the class-dependent '
                           f'layers left at their initial values: {", ".join(reinitialised) or "none"}')
    runner.logger.info(f'Run plan: {describe_topology(backend)}; {plan.describe()}')
    if restarted:
        how = 'torchrun --max-restarts' if restarted_by == 'elastic restart' else 'SLURM_RESTART_COUNT'
        runner.logger.info(f'{restarted_by} {restarted} of the group ({how}): resuming '
                           f'from {resume_from or "the beginning (no complete checkpoint yet)"}')
    if args.resume and not resume_from:
        runner.logger.info(f'--resume: no checkpoint in {cfg.work_dir} yet, starting from the beginning')
    try:
        runner.train()
    except (NonFiniteLossError, CheckpointError) as exc:
        runner.logger.error(str(exc))
        sys.exit(f'error: {exc}')
    except Exception as exc:
        bad = bad_sample_message(exc)  # a validation sample: the metric would be over fewer images
        if bad is None:
            raise
        runner.logger.error(f'validation stopped: {bad}')
        sys.exit(f'error: validation stopped: {bad}')


if __name__ == '__main__':
    main()
