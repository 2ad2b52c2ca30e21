"""Plot a training run's loss, learning rate and validation metric over iterations into a PNG.

Reads MMEngine's scalar log, ``<work_dir>/<timestamp>/vis_data/scalars.json`` (one JSON record
per line), of the newest run in the work dir that trained. Validation records of epoch-based
runs are logged per epoch; they are placed at the last iteration of their epoch. Where the run
logged every rank's figures (``ranks/`` records of the toolkit's RankFiguresHook), a second row
shows them: peak memory per rank, data wait per rank, the slowest rank's own step time beside
the others' median, communication wait per rank (a share of the interval), the network rate per
node (MB/s), GPU utilisation per rank, and the achieved TFLOP/s (mean per rank) with the MFU beside
it, or a note where the device's peak, and so the MFU, is unknown (CPUs, GPUs not in the hook's
table). A panel the run logged nothing for (GPU utilisation and FLOP/s on CPUs) is left out.
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

from xcit_launch.linkless_writes import UnsafeOutput, refuse_link, writing  # noqa: E402  (stdlib only: no stack import)

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


def is_ranks_record(record: dict) -> bool:
    """Whether ``record`` holds every rank's figures (``ranks/`` names) rather than losses or metrics."""
    return any(key.startswith('ranks/') for key in record)


def split_records(records: List[dict]) -> Tuple[List[dict], Dict[str, List[Tuple[int, float]]]]:
    """Training records, and each validation metric as (iteration, value) pairs."""
    train = [r for r in records if 'loss' in r]
    val = [r for r in records if 'loss' not in r and 'lr' not in r and not is_ranks_record(r)]
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


def series(records: List[dict], prefix: str) -> Dict[str, List[Tuple[int, float]]]:
    """{what follows ``prefix`` (a rank, a host): [(iteration, value)]} of the ``ranks/`` records."""
    found: Dict[str, List[Tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith(prefix):
                found.setdefault(key[len(prefix):], []).append((record['step'], value))
    return found


# the panels of every rank's figures: (title, [(name prefix in scalars.json, label prefix)], y label)
RANK_PANELS = (
    ('peak memory per rank', [('ranks/memory_mb/', '')], 'MB'),
    ('data wait per rank', [('ranks/data_wait/', '')], 'share of the interval'),
    ('own step time', [('ranks/own_step_max_s', 'slowest rank'),
                       ('ranks/own_step_others_median_s', "the others' median")], 's'),
    ('communication wait per rank', [('ranks/comm_wait/', '')], 'share of the interval'),
    ('network per node', [('ranks/net_received_mb_s/', 'in '), ('ranks/net_sent_mb_s/', 'out ')], 'MB/s'),
    ('GPU utilisation per rank', [('ranks/gpu_utilisation/', '')], '%'),
)


FLOPS_PANEL = 'achieved FLOP/s and MFU'
NO_MFU = "MFU n/a: the device's peak is unknown"


def plot_flops(ranks: List[dict], axis) -> List[str]:
    """The achieved TFLOP/s per rank (``ranks/tflops_mean``, logged in this run) and, on an axis of its
    own, the MFU (``ranks/mfu_mean``); returns the curves drawn (a note among them where the MFU is absent)."""
    axis.set_title(FLOPS_PANEL)
    axis.set_ylabel('TFLOP/s per rank')
    axis.plot(*zip(*series(ranks, 'ranks/tflops_mean')['']), marker='.', color='tab:blue', label='TFLOP/s per rank')
    axis.ticklabel_format(axis='y', style='sci', scilimits=(-3, 4))
    mfu = series(ranks, 'ranks/mfu_mean').get('')
    if not mfu:
        axis.legend(fontsize=7, title=NO_MFU, title_fontsize=7)
        return ['TFLOP/s per rank', f'({NO_MFU})']
    share = axis.twinx()
    share.plot(*zip(*[(step, 100 * value) for step, value in mfu]), marker='.', color='tab:red', label='MFU')
    share.set_ylabel('MFU (%)')
    axis.legend(handles=axis.get_lines() + share.get_lines(), fontsize=7)
    return ['TFLOP/s per rank', 'MFU']


def rank_panels(ranks: List[dict]) -> List[Tuple[str, str, List[Tuple[str, List[Tuple[int, float]]]]]]:
    """The panels of RANK_PANELS the run logged, as (title, y label, [(curve label, values)])."""
    panels = []
    for title, sources, unit in RANK_PANELS:
        curves = [(f'{label}{name}'.strip(), values) for prefix, label in sources
                  for name, values in sorted(series(ranks, prefix).items())]
        if curves:
            panels.append((title, unit, curves))
    return panels


def plot(train: List[dict], metrics: Dict[str, List[Tuple[int, float]]], out: Path, title: str,
         ranks: List[dict] = ()) -> Dict[str, List[str]]:
    """Draw the panels into ``out``; returns the curves of every rank's panel drawn (the second row: the
    logged panels of RANK_PANELS, then the FLOP/s panel where FLOP/s were logged)."""
    panels = rank_panels(ranks)
    flops = bool(series(ranks, 'ranks/tflops_mean').get(''))
    second = len(panels) + flops  # the second row's panels
    rows, columns = (2 if second else 1), max(3, second)
    fig, grid = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    drawn: Dict[str, List[str]] = {}
    for axis, (panel, unit, curves) in zip(grid[-1], panels):
        for label, values in curves:
            axis.plot(*zip(*values), marker='.', label=label)
        axis.set_title(panel)
        axis.set_ylabel(unit)
        axis.legend(fontsize=7)
        drawn[panel] = [label for label, _ in curves]
    if flops:
        drawn[FLOPS_PANEL] = plot_flops(ranks, grid[1][len(panels)])
    for axis in list(grid[0][3:]) + (list(grid[1][second:]) if second else []):
        axis.axis('off')
    axes = list(grid[0][:3]) + (list(grid[1][:second]) if second else [])
    steps = [r['step'] for r in train]
    loss_axis, lr_axis, metric_axis = grid[0][:3]
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
    try:
        with writing(out) as path:  # a link at its name refused
            fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return drawn


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
    work_dir = scalars.parents[2]
    out = Path(args.out) if args.out else work_dir / 'curves.png'
    records = read_records(scalars)
    train, metrics = split_records(records)
    ranks = [r for r in records if is_ranks_record(r)]
    try:
        refuse_link(out)  # before drawing (plot writes through no link, whatever is at the name by then)
        drawn = plot(train, metrics, out, f'{work_dir.name} ({scalars.parents[1].name})', ranks)
    except UnsafeOutput as exc:
        sys.exit(f'error: {exc}')
    summary = ', '.join(f'{k} {v[-1][1]:.4g}' for k, v in sorted(metrics.items()))
    panels = f', {len(ranks)} of every rank' if ranks else ''
    print(f'{len(train)} training records{panels}{", last " + summary if summary else ""} -> {out}')
    for title, labels in drawn.items():
        print(f'  {title}: {", ".join(labels)}')


if __name__ == '__main__':
    main()
