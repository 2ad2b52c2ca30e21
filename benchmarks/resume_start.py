"""Time from the start of a resumed run to its first new iteration, when it resumes early and late
in an iteration-based run: the toolkit's loop and samplers (the segmentation recipes') against
MMEngine's ``IterBasedTrainLoop`` and ``InfiniteSampler``, which load every trained batch again.

A tiny Semantic FPN on generated images trains a few iterations and saves a checkpoint; the late
checkpoints are that checkpoint with a later iteration and data position written into it (training
that long would take hours). Each resume is a fresh ``tools/train.py --resume`` process training one
more iteration; the time runs to the end of that iteration from the process's launch, and from
the start of training (after the checkpoint was read: what the skip costs, without the imports).
A hook in this module notes the times. Prints a Markdown table.

    .venv/bin/python benchmarks/resume_start.py [--late 20000] [--mmengine-late 1000] [--workers 2]
"""
import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BATCH = 2


def _register_hook() -> None:
    """``FirstIterationTimeHook``, for the training processes (they import this module)."""
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS

    @HOOKS.register_module(force=True)
    class FirstIterationTimeHook(Hook):
        """Write the times training started (after the checkpoint was loaded) and its first
        iteration ended to $RESUME_START_DONE."""

        priority = 'VERY_HIGH'  # before_train before the other hooks

        def __init__(self) -> None:
            self.started = None

        def before_train(self, runner) -> None:
            self.started = time.time()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            if self.started is not None:
                Path(os.environ['RESUME_START_DONE']).write_text(repr((self.started, time.time())))
                self.started = None


if __name__ != '__main__':
    _register_hook()


def write_config(folder: Path, data: Path, toolkit: bool, workers: int) -> Path:
    """The tiny segmentation config of one side of the table."""
    dataset = dict(type='BaseSegDataset', data_root=str(data), img_suffix='.jpg', seg_map_suffix='.png',
                   metainfo=dict(classes=('background', 'rectangle', 'ellipse', 'triangle')),
                   data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                   pipeline=[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
                             dict(type='RandomFlip', prob=0.5), dict(type='PackSegInputs')])
    cfg = dict(
        _base_=[str(ROOT / 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')],
        custom_imports=dict(imports=['xcit_dense', 'resume_start'], allow_failed_imports=False),
        model=dict(data_preprocessor=dict(size=(64, 64)),
                   backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), init_cfg=None),
                   neck=dict(in_channels=[64] * 4, out_channels=32),
                   decode_head=dict(in_channels=[32] * 4, channels=16, num_classes=4)),
        train_dataloader=dict(batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0,
                              sampler=dict(type='ResumableInfiniteSampler' if toolkit else 'InfiniteSampler',
                                           shuffle=True),
                              dataset=dataset),
        train_cfg=dict(type='ResumableIterBasedTrainLoop' if toolkit else 'IterBasedTrainLoop',
                       max_iters=10, val_interval=10 ** 9),
        val_dataloader=None, val_cfg=None, val_evaluator=None,
        test_dataloader=None, test_cfg=None, test_evaluator=None,
        param_scheduler=[],
        default_hooks=dict(checkpoint=dict(interval=10), logger=dict(interval=1000),
                           visualization=dict(draw=False)),
        custom_hooks=[dict(type='FirstIterationTimeHook')],
        randomness=dict(seed=0))
    path = folder / ('toolkit.py' if toolkit else 'mmengine.py')
    path.write_text('\n'.join(f'{k} = {v!r}' for k, v in cfg.items()) + '\n')
    return path


def train(config: Path, work_dir: Path, *options: str, done: Path = None) -> Tuple[float, float]:
    """Run tools/train.py; the seconds from its launch, and from the start of training (the
    checkpoint loaded), to the end of its first iteration."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get('PYTHONPATH', '')]),
               RESUME_START_DONE=str(done or work_dir / 'done'))
    start = time.time()
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/train.py'), str(config), '--work-dir', str(work_dir),
                           *options], env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f'training failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    started, ended = ast.literal_eval(Path(env['RESUME_START_DONE']).read_text())
    return ended - start, ended - started


def moved_checkpoint(checkpoint: Path, iteration: int, out: Path) -> Path:
    """``checkpoint`` as if written at ``iteration``: its iteration and data position rewritten."""
    import torch
    state = torch.load(checkpoint, map_location='cpu', weights_only=False)
    state['meta']['iter'] = iteration
    state['meta']['data_position'] = dict(epoch=0, samples=iteration * BATCH)
    torch.save(state, out)
    return out


def resume_time(config: Path, checkpoint: Path, work_dir: Path, repeat: int) -> Tuple[float, float]:
    """The seconds of :func:`train` to the first new iteration of a resume from ``checkpoint``,
    each the least of ``repeat`` runs."""
    import torch
    iteration = torch.load(checkpoint, map_location='cpu', weights_only=False)['meta']['iter']
    runs = [train(config, work_dir / str(run), '--resume', str(checkpoint), '--cfg-options',
                  f'train_cfg.max_iters={iteration + 1}', 'default_hooks.checkpoint.interval=1000000')
            for run in range(repeat)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--late', type=int, default=20000, help="the toolkit's late resume iteration")
    parser.add_argument('--mmengine-late', type=int, default=1000,
                        help="MMEngine's late resume iteration (0: skip MMEngine's rows)")
    parser.add_argument('--workers', type=int, default=2, help='data workers')
    parser.add_argument('--images', type=int, default=64, help='images in the generated set')
    parser.add_argument('--repeat', type=int, default=3, help='runs of each resume (the least time is shown)')
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from xcit_dense.datasets.synthetic import write_segmentation_set
    rows = []
    with tempfile.TemporaryDirectory(prefix='resume-start-') as tmp:
        tmp = Path(tmp)
        data = tmp / 'data'
        write_segmentation_set(data, 'training', args.images, size=(64, 64), seed=0)
        sides = [('toolkit (ResumableIterBasedTrainLoop, ResumableInfiniteSampler)', True, args.late)]
        if args.mmengine_late:
            sides.append(('MMEngine (IterBasedTrainLoop, InfiniteSampler)', False, args.mmengine_late))
        for name, toolkit, late in sides:
            config = write_config(tmp, data, toolkit, args.workers)
            first = tmp / f'{toolkit}-first'
            fresh = train(config, first)
            early = first / 'iter_10.pth'
            for iteration, checkpoint in ((10, early), (late, moved_checkpoint(early, late, tmp / f'iter_{late}.pth'))):
                rows.append((name, fresh, iteration, *resume_time(config, checkpoint, tmp / f'{toolkit}-{iteration}',
                                                                    args.repeat)))
    print(f'{args.images} generated 64x64 images, {BATCH} per batch, {args.workers} data workers, one process; '
          f'seconds to the end of the first new iteration, the least of {args.repeat} runs each; the ratio is '
          f'to the same loop resumed at iteration 10\n')
    print('| loop and sampler | resume at iteration | from launch | ratio | from training start | ratio |')
    print('|---|---|---|---|---|---|')
    for name, fresh, iteration, launch, training in rows:
        early = next(r for r in rows if r[0] == name and r[2] == 10)
        print(f'| {name} | {iteration:,} | {launch:.1f} | {launch / early[3]:.2f}x | {training:.2f} | '
              f'{training / early[4]:.2f}x |')
    for name in dict.fromkeys(r[0] for r in rows):
        fresh = next(r[1] for r in rows if r[0] == name)
        print(f'\n{name}, fresh run: {fresh[0]:.1f} s from launch, {fresh[1]:.2f} s from training start', end='')
    print()


if __name__ == '__main__':
    main()
