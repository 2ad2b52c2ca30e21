"""Plot a training run's loss, learning rate and validation metric over iterations into a PNG.

Reads MMEngine's scalar log, ``<work_dir>/<timestamp>/vis_data/scalars.json`` (one JSON record
per line), of the newest run in the work dir that trained. Validation records of epoch-based
runs are logged per epoch; they are placed at the last iteration of their epoch.
"""
import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

# the headline metric of each task; others are plotted only when none of these is logged
MAIN_METRIC = re.compile(r'(^|/)(bbox_mAP|segm_mAP|mIoU)$')
NOT_METRICS = {'step', 'time', 'data_time', 'iter', 'epoch', 'memory'}


def find_scalars(work_dir: Path) -> Path:
    """The newest ``scalars.json`` of ``work_dir`` that holds training records."""
    logs = sorted(work_dir.glob('*/vis_data/scalars.json'), reverse=True)
    for log in logs:
        if any('loss' in record for record in read_records(log)):
            return log
    raise FileNotFoundError(f'no training log (*/vis_data/scalars.json with a loss) in {work_dir}')


def read_records(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_records(records: List[dict]) -> Tuple[List[dict], Dict[str, List[Tuple[int, float]]]]:
    """Training records, and each validation metric as (iteration, value) pairs."""
    train = [r for r in records if 'loss' in r]
    val = [r for r in records if 'loss' not in r and 'lr' not in r]
    last_iter_of_epoch: Dict[int, int] = {}
    for record in train:
        if 'epoch' in record:
            last_iter_of_epoch[record['epoch']] = max(last_iter_of_epoch.get(record['epoch'], 0), record['step'])
    by_epoch = bool(last_iter_of_epoch) and all(r['step'] in last_iter_of_epoch for r in val)
    metrics: Dict[str, List[Tuple[int, float]]] = {}
    for record in val:
        step = last_iter_of_epoch[record['step']] if by_epoch else record['step']
        for key, value in record.items():
            if key not in NOT_METRICS and isinstance(value, (int, float)):
                metrics.setdefault(key, []).append((step, value))
    main = {k: v for k, v in metrics.items() if MAIN_METRIC.search(k)}
    return train, main or metrics


def plot(train: List[dict], metrics: Dict[str, List[Tuple[int, float]]], out: Path, title: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps = [r['step'] for r in train]
    loss_axis, lr_axis, metric_axis = axes
    for key in sorted({k for r in train for k in r if k.startswith('loss')}):
        values = [(r['step'], r[key]) for r in train if key in r]
        loss_axis.plot(*zip(*values), label=key, linewidth=2 if key == 'loss' else 0.8)
    loss_axis.set_yscale('log')
    loss_axis.set_title('training loss')
    loss_axis.legend(fontsize=7)
    lr_axis.plot(steps, [r.get('lr', r.get('base_lr')) for r in train], color='tab:orange')
    lr_axis.set_title('learning rate')
    lr_axis.ticklabel_format(axis='y', style='sci', scilimits=(0, 0))
    for key, values in sorted(metrics.items()):
        metric_axis.plot(*zip(*values), marker='o', label=f'{key} (last {values[-1][1]:.3f})')
    metric_axis.set_title('validation')
    if metrics:
        metric_axis.legend(fontsize=8)
    else:
        metric_axis.text(0.5, 0.5, 'no validation in this run', ha='center', va='center')
    for axis in axes:
        axis.set_xlabel('iteration')
        axis.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('work_dir', help="a training run's work dir (or one of its scalars.json)")
    parser.add_argument('--out', help='PNG to write (default: <work_dir>/curves.png)')
    args = parser.parse_args()
    source = Path(args.work_dir)
    try:
        scalars = source if source.is_file() else find_scalars(source)
    except FileNotFoundError as exc:
        sys.exit(f'error: {exc}')
    train, metrics = split_records(read_records(scalars))
    work_dir = scalars.parents[2]
    out = Path(args.out) if args.out else work_dir / 'curves.png'
    plot(train, metrics, out, f'{work_dir.name} ({scalars.parents[1].name})')
    summary = ', '.join(f'{k} {v[-1][1]:.4g}' for k, v in sorted(metrics.items()))
    print(f'{len(train)} training records{", last " + summary if summary else ""} -> {out}')


if __name__ == '__main__':
    main()
