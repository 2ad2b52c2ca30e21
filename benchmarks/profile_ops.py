"""Where one XCiT block spends its CPU time as the token count grows: this toolkit's block beside timm's.

Both blocks share weights (timm's is the reference layout this toolkit had before its CPU layouts).
Each round runs every variant once, in rotating order, so load on the machine hits both alike;
figures are medians over the rounds. ``module_times`` times XCA, LPI and the MLP (each with its
norm and residual) with a wall clock; ``operator_times`` sums the profiler's self CPU time per
ATen operator over one block call, ``backbone_operator_times`` over one inference of the backbone
(this toolkit's XCiT and timm's XCiT plus the same pyramid ops).
"""
import os
import statistics
import time
from functools import partial
from typing import Callable, Dict, List, Sequence

import torch
from torch import nn

from xcit_dense.models.layers import XCABlock
from xcit_dense.models.xcit import XCiT

RESOLUTIONS = (512, 1024, 1600, 2048)
PATCH = 16


def make_blocks(dims: int = 384, heads: int = 8) -> Dict[str, nn.Module]:
    """timm's XCiT block and this toolkit's, in eval mode, on the same random weights."""
    from timm.models.xcit import XCABlock as TimmBlock
    torch.manual_seed(0)
    ref = TimmBlock(dims, heads, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    ref.attn.fused_attn = False
    ours = XCABlock(dims, heads).eval()
    ours.load_state_dict(ref.state_dict(), strict=False)
    return {'timm': ref, 'ours': ours}


def _parts(block: nn.Module, x: torch.Tensor, side: int) -> Dict[str, Callable[[], torch.Tensor]]:
    """The block's three sub-layers (norm, layer, layer scale and residual) and the whole block."""
    def residual(gamma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return block._residual(x, gamma, y) if hasattr(block, '_residual') else x + gamma * y
    return {'XCA': lambda: residual(block.gamma1, block.attn(block.norm1(x))),
            'LPI': lambda: residual(block.gamma3, block.local_mp(block.norm3(x), side, side)),
            'MLP': lambda: residual(block.gamma2, block.mlp(block.norm2(x))),
            'block': lambda: block(x, side, side)}


def _rotating(calls: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, List[float]]:
    """Milliseconds of every call per round, the order rotating each round, after one warm-up round."""
    names, times = list(calls), {name: [] for name in calls}
    for i in range(rounds + 1):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            calls[name]()
            if i:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def module_times(blocks: Dict[str, nn.Module], resolutions: Sequence[int] = RESOLUTIONS,
                 rounds: int = 5) -> Dict[str, Dict[int, Dict[str, float]]]:
    """variant -> resolution -> part -> median ms, for one image at each square resolution."""
    out: Dict[str, Dict[int, Dict[str, float]]] = {name: {} for name in blocks}
    with torch.no_grad():
        for res in resolutions:
            side = res // PATCH
            x = torch.randn(1, side * side, next(iter(blocks.values())).norm1.normalized_shape[0])
            calls = {(name, part): fn for name, block in blocks.items() for part, fn in _parts(block, x, side).items()}
            for (name, part), times in _rotating(calls, rounds).items():
                out[name].setdefault(res, {})[part] = statistics.median(times)
    return out


def _profiled(calls: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, Dict[str, float]]:
    """name -> ATen operator -> median self CPU ms of one call, the order rotating each round."""
    from torch.profiler import ProfilerActivity, profile
    names = list(calls)
    samples: Dict[str, List[Dict[str, float]]] = {name: [] for name in names}
    for i in range(rounds + 1):  # the first round warms up
        for name in names[i % len(names):] + names[:i % len(names)]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                calls[name]()
            if i:
                samples[name].append({e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()})
    return {name: {op: statistics.median(run.get(op, 0.0) for run in runs) for op in {o for r in runs for o in r}}
            for name, runs in samples.items()}


def operator_times(blocks: Dict[str, nn.Module], resolutions: Sequence[int] = RESOLUTIONS,
                   rounds: int = 3) -> Dict[str, Dict[int, Dict[str, float]]]:
    """variant -> resolution -> ATen operator -> median self CPU ms in one block call."""
    out: Dict[str, Dict[int, Dict[str, float]]] = {name: {} for name in blocks}
    with torch.no_grad():
        for res in resolutions:
            side = res // PATCH
            x = torch.randn(1, side * side, next(iter(blocks.values())).norm1.normalized_shape[0])
            calls = {name: partial(block, x, side, side) for name, block in blocks.items()}
            for name, ops in _profiled(calls, rounds).items():
                out[name][res] = ops
    return out


def backbone_operator_times(resolutions: Sequence[int] = RESOLUTIONS, rounds: int = 1,
                            arch: str = 'small_12') -> Dict[str, Dict[int, Dict[str, float]]]:
    """variant -> resolution -> ATen operator -> median self CPU ms in one inference of the whole
    backbone: this toolkit's XCiT and timm's XCiT plus the same pyramid ops, on the same weights."""
    from .catalogue import BenchTimmXCiTPyramid
    torch.manual_seed(0)
    ours = XCiT(arch=arch, patch_size=PATCH)
    ours.init_weights()
    models = {'timm': BenchTimmXCiTPyramid(arch, PATCH, source=ours).eval(), 'ours': ours.eval()}
    out: Dict[str, Dict[int, Dict[str, float]]] = {name: {} for name in models}
    with torch.no_grad():
        for res in resolutions:
            x = torch.randn(1, 3, res, res)
            for name, ops in _profiled({name: partial(m, x) for name, m in models.items()}, rounds).items():
                out[name][res] = ops
    return out


def growth_markdown(table: Dict[int, Dict[str, float]], title: str, min_ms: float = 1.0) -> str:
    """Rows of ``table`` (resolution -> row -> ms): time at each resolution, then the growth between
    consecutive resolutions beside the pixel ratio; rows under ``min_ms`` everywhere are left out."""
    resolutions = sorted(table)
    spans = list(zip(resolutions, resolutions[1:]))
    rows = sorted({r for res in resolutions for r in table[res]},
                  key=lambda r: -table[resolutions[-1]].get(r, 0.0))
    head = ([f'{res}^2 ({(res // PATCH) ** 2} tok) ms' for res in resolutions]
            + [f'x {lo}->{hi} (pixels x{(hi / lo) ** 2:.2f})' for lo, hi in spans])
    lines = [f'**{title}**', '', '| ' + ' | '.join(['op'] + head) + ' |', '|---' * (len(head) + 1) + '|']
    for row in rows:
        ms = [table[res].get(row, 0.0) for res in resolutions]
        if max(ms) < min_ms:
            continue
        factors = [f'x{b / a:.2f}' if a > 0 else '-' for a, b in zip(ms, ms[1:])]
        lines.append('| ' + ' | '.join([row] + [f'{t:.1f}' for t in ms] + factors) + ' |')
    return '\n'.join(lines + [''])


def speedup_markdown(speedup: Dict[int, Dict[str, float]]) -> str:
    """timm's time over this toolkit's, per sub-layer and resolution."""
    resolutions = sorted(speedup)
    lines = ['**Speed-up of this toolkit over timm** (timm ms / ours ms, same round)', '',
             '| part | ' + ' | '.join(f'{res}^2' for res in resolutions) + ' |', '|---' * (len(resolutions) + 1) + '|']
    for part in speedup[resolutions[0]]:
        lines.append(f'| {part} | ' + ' | '.join(f'{speedup[res][part]:.2f}' for res in resolutions) + ' |')
    return '\n'.join(lines + [''])


def report(resolutions: Sequence[int] = RESOLUTIONS, rounds: int = 5, threads: int = 2) -> str:
    """The per-sub-layer and per-operator tables of one block and the per-operator tables of the
    whole backbone (one profiled round), timm's beside this toolkit's, as markdown."""
    torch.set_num_threads(threads)
    blocks = make_blocks()
    op_rounds = max(rounds // 2, 1)
    parts, ops = module_times(blocks, resolutions, rounds), operator_times(blocks, resolutions, op_rounds)
    backbone = backbone_operator_times(resolutions)
    sections = [f'One XCiT-S12 block (384 channels, 8 heads) and the XCiT-S12/16 backbone, inference, batch 1, '
                f'{threads} threads; medians of {rounds} rotating rounds (block operators: {op_rounds}, '
                f'backbone operators: 1); load average {os.getloadavg()[0]:.1f} at the end.', '']
    for name in blocks:
        sections.append(growth_markdown(parts[name], f'{name}: block sub-layers (wall ms)', 0.0))
    speedup = {res: {part: parts['timm'][res][part] / parts['ours'][res][part] for part in parts['ours'][res]}
               for res in resolutions}
    sections.append(speedup_markdown(speedup))
    for name in blocks:
        sections.append(growth_markdown(ops[name], f'{name}: ATen operators of one block (self CPU ms)'))
    for name in backbone:
        sections.append(growth_markdown(backbone[name], f'{name}: ATen operators of the backbone (self CPU ms)',
                                        min_ms=10.0))
    return '\n'.join(sections)
