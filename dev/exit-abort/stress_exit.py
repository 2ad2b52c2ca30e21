"""Run a short multi-process job many times and count how each process ended.

Made for the exit abort of issue 10 (a finished gloo run dying with SIGABRT at interpreter exit):
  python dev/exit-abort/stress_exit.py minimal --runs 100 --busy 2 [--before-fix] [--starve]
                                                    # dev/exit-abort/exit_repro.py, seconds a run
  python dev/exit-abort/stress_exit.py train --runs 30 --busy 2   # the demo Mask R-CNN, 2 processes
  python dev/exit-abort/stress_exit.py test --runs 30 --busy 2    # dist_test.sh on its checkpoint
``--busy K`` keeps K busy loops running meanwhile (load makes the race likelier). Each failed
run's output, and its core file where the kernel writes one into the working directory, is kept
under ``--keep DIR``. The last line is ``N passed, M failed``.
"""
import argparse
import collections
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def demo_config(tmp: Path) -> Path:
    """The demo Mask R-CNN shrunk as in tests/integration/test_demo.py: 4 images of 64x64, one epoch."""
    from xcit_dense.datasets.synthetic import write_coco_set
    data = tmp / 'coco'
    for split, count in (('train', 4), ('val', 2)):
        write_coco_set(data, split, count, size=(64, 64), seed=0 if split == 'train' else 1, max_objects=5)
    config = tmp / 'demo_stress.py'
    base = ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py'
    loader = f"dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(data_root={str(data)!r}))"
    config.write_text(
        f"_base_ = [{str(base)!r}]\n"
        f"train_dataloader = {loader}\nval_dataloader = {loader}\ntest_dataloader = val_dataloader\n"
        f"val_evaluator = dict(ann_file={str(data / 'annotations/instances_val.json')!r})\n"
        f"test_evaluator = val_evaluator\n"
        f"train_cfg = dict(max_epochs=1, val_interval=1)\n"
        f"default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))\n")
    return config


def command(kind: str, tmp: Path, config: Path, repro_args: list) -> list:
    if kind == 'minimal':
        torchrun = Path(sys.executable).with_name('torchrun')
        return [str(torchrun), '--nproc_per_node=2', '--master_port', str(free_port()),
                str(Path(__file__).with_name('exit_repro.py')), *repro_args]
    if kind == 'train':
        return ['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '2', '--work-dir', str(tmp / 'work')]
    checkpoint = tmp / 'work/epoch_1.pth'
    return ['bash', str(ROOT / 'tools/dist_test.sh'), str(config), str(checkpoint), '2',
            '--work-dir', str(tmp / 'eval')]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('kind', choices=['minimal', 'train', 'test'])
    parser.add_argument('--runs', type=int, default=30)
    parser.add_argument('--busy', type=int, default=2, help='busy loops running meanwhile')
    parser.add_argument('--before-fix', action='store_true',
                        help='minimal: set up and tear down the group as the toolkit did before the fix')
    parser.add_argument('--starve', action='store_true',
                        help="minimal: lower the group's work threads to nice 19")
    parser.add_argument('--keep', type=Path, default=Path(tempfile.gettempdir()) / 'stress_exit',
                        help='where failed runs leave their output and core files')
    args = parser.parse_args()
    # core files of this script's children only (the kernel writes them into the run's directory)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    # busy loops that end with this script, however it ends
    spin = 'import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass'
    busy = [subprocess.Popen([sys.executable, '-c', spin]) for _ in range(args.busy)]
    outcomes = collections.Counter()
    repro_args = [flag for flag, on in (('--before-fix', args.before_fix), ('--starve', args.starve)) if on]
    try:
        with tempfile.TemporaryDirectory(prefix='stress-exit-') as tmp:
            tmp = Path(tmp)
            config = demo_config(tmp) if args.kind != 'minimal' else None
            if args.kind == 'test':  # one training run makes the checkpoint the test runs evaluate
                subprocess.run(command('train', tmp, config, repro_args), cwd=tmp, check=True,
                               capture_output=True, env=dict(os.environ, PORT=str(free_port())))
            for i in range(args.runs):
                start = time.monotonic()
                env = dict(os.environ, PORT=str(free_port()))
                proc = subprocess.run(command(args.kind, tmp, config, repro_args), cwd=tmp, env=env,
                                      capture_output=True, text=True)
                aborted = 'SIGABRT' in proc.stderr or 'Signal 6' in proc.stderr or 'terminate called' in proc.stderr
                outcome = 'ok' if proc.returncode == 0 else ('abort' if aborted else f'exit {proc.returncode}')
                outcomes[outcome] += 1
                print(f'run {i + 1}/{args.runs}: {outcome} ({time.monotonic() - start:.1f} s)', flush=True)
                if proc.returncode:
                    keep = args.keep / f'{args.kind}-{i + 1}'
                    keep.mkdir(parents=True, exist_ok=True)
                    (keep / 'output.txt').write_text(proc.stdout + proc.stderr)
                    for core in tmp.glob('core*'):
                        shutil.move(str(core), keep / core.name)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(dict(outcomes))
    print(f"{outcomes['ok']} passed, {args.runs - outcomes['ok']} failed")
    sys.exit(0 if outcomes['ok'] == args.runs else 1)


if __name__ == '__main__':
    main()
