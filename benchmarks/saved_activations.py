"""What a training step's autograd graph keeps for the backward, per operator, for XCiT and Swin-T.

Builds the backbones (random weights, training mode), runs one forward at the given size and walks
the autograd graph from the summed outputs: each node's saved tensors (``_saved_*``) are counted
once per storage, charged to the first node found holding them, parameters and the input left out.
The node names are the backward functions (``GeluBackward0`` is what GELU's forward saved;
custom functions' nodes are named ``<Function>Backward``); the
second table groups the same bytes by the module whose forward built the node. Saved bytes do not
depend on the machine's load or device: a GPU keeps the same tensors. XCiT runs its fast layers
(``fast_layers=True``), on a CPU in their CPU layouts unless ``--layout reference`` (what they run on a
GPU); ``--plain-operators`` adds the plain model (``fast_layers=False``, what GPUs run by default).

    python benchmarks/saved_activations.py --size 800 1344 --batch 2 --plain-operators
    python benchmarks/saved_activations.py --models xcit_s12_p16 --layout reference --with-cp selective

Activation checkpointing stores its tensors outside the graph's nodes; with ``--with-cp`` the
figure is the peak tensor memory of forward plus backward instead (the profiler's allocations).
"""
import argparse
import collections
import contextlib
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {
    'xcit_s12_p16': dict(type='XCiT', arch='small_12', patch_size=16),
    'xcit_s12_p8': dict(type='XCiT', arch='small_12', patch_size=8),
    'xcit_t12_p16': dict(type='XCiT', arch='tiny_12', patch_size=16),
    # mmdet's Swin-T Mask R-CNN 3x backbone
    'swin_t': dict(type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                   window_size=7, mlp_ratio=4, qkv_bias=True, drop_path_rate=0.2, patch_norm=True,
                   out_indices=(0, 1, 2, 3), with_cp=False, convert_weights=False),
}


def build(name: str, with_cp, fast: bool = True) -> nn.Module:
    import mmdet.models  # noqa: F401  (registers mmdet's backbones)
    from mmengine.registry import MODELS as REGISTRY

    import xcit_dense  # noqa: F401
    cfg = dict(MODELS[name])
    if with_cp:
        cfg['with_cp'] = with_cp
    if cfg['type'] == 'XCiT':
        cfg['fast_layers'] = fast
    model = REGISTRY.build(cfg)
    model.init_weights()
    model.train()
    return model


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def saved_per_node(roots, skip: Set[int], owner: Dict) -> Tuple[Dict[str, List[int]], Dict[str, int]]:
    """{node name: [bytes, tensors]} and {module class: bytes} of what the graph below ``roots`` saved."""
    per_node: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
    per_module: Dict[str, int] = collections.defaultdict(int)
    seen_nodes, seen_storages = set(), set(skip)
    stack = list(roots)
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen_nodes:
            continue
        seen_nodes.add(fn)
        # built-in nodes expose each saved tensor as _saved_<name>; custom autograd functions as saved_tensors
        for attr in [a for a in dir(fn) if a.startswith('_saved_')] + ['saved_tensors']:
            try:
                value = getattr(fn, attr)
            except (RuntimeError, AttributeError):  # freed, not a tensor, or not a custom function
                continue
            for t in _tensors(value):
                storage = t.untyped_storage()
                if storage.data_ptr() in seen_storages or storage.nbytes() == 0:
                    continue
                seen_storages.add(storage.data_ptr())
                per_node[fn.name()][0] += storage.nbytes()
                per_node[fn.name()][1] += 1
                per_module[owner.get(fn, '(outside modules)')] += storage.nbytes()
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return per_node, per_module


def node_owners(model: nn.Module, run) -> Tuple[object, Dict]:
    """Run ``run()`` and tie each autograd node it creates to the innermost module class building it:
    a module's output nodes and everything between its input and output belong to it."""
    owner: Dict = {}
    stack: List[str] = []

    def pre(module, args):
        stack.append(type(module).__name__)

    def post(module, args, output):
        name = stack.pop()
        inputs = {t.grad_fn for t in _tensors(args) if t.grad_fn is not None}
        frontier = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        while frontier:  # nodes created inside this module: from its outputs back to its inputs
            fn = frontier.pop()
            if fn is None or fn in owner or fn in inputs:
                continue
            owner[fn] = name
            frontier.extend(next_fn for next_fn, _ in fn.next_functions)

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        out = run()
    finally:
        for h in handles:
            h.remove()
    return out, owner


def measure(name: str, size: Tuple[int, int], batch: int, layout: str, plain: bool = False) -> dict:
    from xcit_dense.models.fast.cpu_layouts import reference_layout
    torch.manual_seed(0)
    model = build(name, False, fast=not plain)
    x = torch.randn(batch, 3, *size)
    with reference_layout() if layout == 'reference' else contextlib.nullcontext():
        outs, owner = node_owners(model, lambda: model(x))
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    skip.add(x.untyped_storage().data_ptr())
    per_node, per_module = saved_per_node([o.grad_fn for o in outs], skip, owner)
    outputs = sum(o.untyped_storage().nbytes() for o in outs)
    return dict(name=name + (' (plain layers)' if plain else ''), per_node=per_node, per_module=per_module,
                total=sum(b for b, _ in per_node.values()), outputs=outputs)


def peak_with_cp(name: str, size: Tuple[int, int], batch: int, layout: str, with_cp) -> int:
    """Peak tensor bytes of forward + backward (allocations the profiler saw), above the model and input."""
    from torch.profiler import ProfilerActivity, profile

    from xcit_dense.models.fast.cpu_layouts import reference_layout
    torch.manual_seed(0)
    model = build(name, with_cp)
    x = torch.randn(batch, 3, *size)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
            reference_layout() if layout == 'reference' else contextlib.nullcontext():
        sum(o.float().mean() for o in model(x)).backward()
    allocations = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                         if e.name() == '[memory]')  # + allocated, - freed, in time order
    live = peak = 0
    for _, nbytes in allocations:
        live += nbytes
        peak = max(peak, live)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', default=['xcit_s12_p16', 'swin_t'], choices=sorted(MODELS))
    parser.add_argument('--size', nargs=2, type=int, default=[800, 1344], metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--layout', choices=('reference', 'cpu'), default='reference',
                        help="XCiT's fast layers as they run on GPUs (reference) or in the CPU layouts")
    parser.add_argument('--with-cp', choices=('none', 'full', 'selective'), nargs='+', default=['none'],
                        help='checkpointing modes for the peak-memory table')
    parser.add_argument('--plain-operators', action='store_true',
                        help="also XCiT's plain layers (fast_layers=False): no recomputing autograd functions, "
                             "no layer-scale fold")
    parser.add_argument('--top', type=int, default=12)
    args = parser.parse_args()
    size = tuple(args.size)
    gib = 2 ** 30
    print(f'# Saved for the backward: {args.batch} x 3 x {size[0]} x {size[1]}, training mode, '
          f'layout {args.layout}, torch {torch.__version__}\n')
    results = [measure(name, size, args.batch, args.layout) for name in args.models]
    if args.plain_operators:
        results += [measure(name, size, args.batch, args.layout, plain=True) for name in args.models
                    if MODELS[name]['type'] == 'XCiT']
    print('| model | saved tensors (GiB) | outputs (GiB) |\n|---|---|---|')
    for r in results:
        print(f"| {r['name']} | {r['total'] / gib:.3f} | {r['outputs'] / gib:.3f} |")
    for r in results:
        print(f"\n## {r['name']}: per backward node (the forward operator that saved)\n")
        print('| node | tensors | GiB | share |\n|---|---|---|---|')
        for node, (nbytes, count) in sorted(r['per_node'].items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"| {node} | {count} | {nbytes / gib:.3f} | {nbytes / r['total']:.0%} |")
        print(f"\n## {r['name']}: per module class\n\n| module | GiB | share |\n|---|---|---|")
        for module, nbytes in sorted(r['per_module'].items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"| {module} | {nbytes / gib:.3f} | {nbytes / r['total']:.0%} |")
    if args.with_cp != ['none']:
        modes = {'none': False, 'full': True, 'selective': 'selective'}
        print('\n## Peak tensor memory of forward + backward (GiB)\n')
        print('| model | ' + ' | '.join(args.with_cp) + ' |\n|---|' + '---|' * len(args.with_cp))
        for name in args.models:
            cells = [f'{peak_with_cp(name, size, args.batch, args.layout, modes[m]) / gib:.3f}'
                     if m != 'selective' or MODELS[name]['type'] == 'XCiT' else 'n/a' for m in args.with_cp]
            print(f'| {name} | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
    main()
