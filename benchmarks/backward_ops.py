"""The whole detector's training-step backward per operator: Mask R-CNN XCiT-S12/16 beside mmdet's
Swin-T Mask R-CNN 3x, side by side in one process.

Each model runs a warm-up step, then ``--rounds`` profiled training steps, the models alternated.
Two views of the backward, medians over the rounds:

- per autograd node, in the part whose forward built it (``whole_model.backward_node_seconds``): the
  node's name is the forward operator that recorded it (``AddmmBackward0``: a linear layer's matrix
  product; ``GeluLinearBackward``: XCiT's fc2 after GELU; ``NativeLayerNormBackward0``: a LayerNorm),
  its time the whole node with what it calls;
- per ATen operator run inside the backward (self time): the kernels those nodes spend it in.

The profiler slows small operators more than large ones: compare shares and the two models, not
the seconds with the timed steps of ``python -m benchmarks whole_models``. On a CPU, XCiT runs its fast
layers in their CPU layouts; ``--layout reference`` runs them as on a GPU.

    PYTHONPATH=. python benchmarks/backward_ops.py --size 800 1333 --batch 2 --rounds 2 --top 15
    PYTHONPATH=. python benchmarks/backward_ops.py --by-shape aten::convolution_backward --top 25
"""
import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from mmengine.logging import MMLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.whole_model import WholeModel, backward_aten_seconds, backward_node_seconds  # noqa: E402

MODELS = ('mask_rcnn_xcit_s12_p16', 'mask_rcnn_swin_t')


def profile_rounds(models: List[WholeModel], rounds: int, layout: str, by_shape: List[str] = ()) -> Dict[str, dict]:
    """Per model: median seconds per (part, node) and per backward ATen operator (those of
    ``by_shape`` per input shapes), over ``rounds``."""
    from xcit_dense.models.fast.cpu_layouts import reference_layout
    runs = {m.name: {'nodes': [], 'aten': []} for m in models}
    context = reference_layout if layout == 'reference' else contextlib.nullcontext
    with context():
        for m in models:
            m.step('train')  # warm-up
        for r in range(rounds):
            for m in models[r % len(models):] + models[:r % len(models)]:
                prof = m.profiled_step(record_shapes=bool(by_shape))
                runs[m.name]['nodes'].append(backward_node_seconds(prof.profiler.kineto_results.events()))
                runs[m.name]['aten'].append(backward_aten_seconds(prof.events(), by_shape))
                print(f'round {r + 1}: {m.name} profiled', file=sys.stderr)
    return {name: {kind: _medians(done) for kind, done in run.items()} for name, run in runs.items()}


def _medians(done: List[dict]) -> dict:
    keys = set().union(*done)
    return {k: statistics.median(d.get(k, 0.0) for d in done) for k in keys}


def node_table(results: Dict[str, dict], part: str, top: int) -> List[str]:
    """The ``top`` nodes of ``part`` (``all``: every part) by the first model's time, both models."""
    names = list(results)
    per_model = {}
    for n in names:
        nodes: Dict[str, float] = {}
        for (p, node), s in results[n]['nodes'].items():
            if part in ('all', p):
                nodes[node] = nodes.get(node, 0.0) + s
        per_model[n] = nodes
    totals = {n: sum(per_model[n].values()) for n in names}
    order = sorted(set().union(*per_model.values()), key=lambda k: -max(per_model[n].get(k, 0.0) for n in names))
    head = ' | '.join(f'{n} s | share' for n in names)
    lines = [f'**backward nodes built in {part}** (in all: ' + ', '.join(f'{n} {totals[n]:.2f} s' for n in names)
             + ')', '', f'| node | {head} |', '|---|' + '---|---|' * len(names)]
    for node in order[:top]:
        cells = ' | '.join(f'{per_model[n].get(node, 0.0):.2f} | {per_model[n].get(node, 0.0) / totals[n]:.0%}'
                           if totals[n] else '0 | 0%' for n in names)
        lines.append(f'| {node} | {cells} |')
    return lines + ['']


def aten_table(results: Dict[str, dict], top: int) -> List[str]:
    names = list(results)
    totals = {n: sum(results[n]['aten'].values()) for n in names}
    order = sorted(set().union(*(results[n]['aten'] for n in names)),
                   key=lambda k: -max(results[n]['aten'].get(k, 0.0) for n in names))
    head = ' | '.join(f'{n} s | share' for n in names)
    lines = ['**ATen operators inside the backward, self time** (in all: '
             + ', '.join(f'{n} {totals[n]:.2f} s' for n in names) + ')', '',
             f'| operator | {head} |', '|---|' + '---|---|' * len(names)]
    for op in order[:top]:
        cells = ' | '.join(f'{results[n]["aten"].get(op, 0.0):.2f} | {results[n]["aten"].get(op, 0.0) / totals[n]:.0%}'
                           for n in names)
        lines.append(f'| {op} | {cells} |')
    return lines + ['']


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--size', nargs=2, type=int, default=[800, 1333], metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--instances', type=int, default=7, help='boxes and masks per image')
    parser.add_argument('--layout', choices=('cpu', 'reference'), default='cpu')
    parser.add_argument('--top', type=int, default=15)
    parser.add_argument('--by-shape', nargs='*', default=[], metavar='OP',
                        help='ATen operators split by input shapes, e.g. aten::convolution_backward')
    args = parser.parse_args()
    MMLogger.get_instance('mmengine', log_level='WARNING')  # not the weights' initialisation report
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.time()
    load = open('/proc/loadavg').read().split()[0]
    size: Tuple[int, int] = tuple(args.size)
    models = [WholeModel(name, size, args.batch, args.instances) for name in MODELS]
    results = profile_rounds(models, args.rounds, args.layout, args.by_shape)
    print(f'# The training step\'s backward per operator, batch {args.batch}, {size[0]}x{size[1]}\n')
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, XCiT layout {args.layout}; '
          f'random weights, {args.instances} boxes and masks per image; medians of {args.rounds} profiled '
          f'steps per model, alternated.\n')
    for part in ('all', 'backbone'):
        print('\n'.join(node_table(results, part, args.top)))
    print('\n'.join(aten_table(results, args.top)))
    print(f'Command: `PYTHONPATH=. python benchmarks/backward_ops.py {" ".join(sys.argv[1:])}`; '
          f'{time.time() - start:.0f} s in all, load average {load} at the start, '
          f'{open("/proc/loadavg").read().split()[0]} at the end.')


if __name__ == '__main__':
    main()
