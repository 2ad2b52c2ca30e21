"""The acceptance targets of the benchmark as data, and the ratios and verdicts measured against them.

``TARGETS`` holds the limits: ``max`` and ``min`` bound a value, ``tolerance`` bounds how far a
ratio may stray from 1. ``compute_ratios`` reads them; nothing else states a limit.
"""
import argparse
import math
from typing import Dict, List, Mapping, Optional, Tuple

TARGETS: Dict[str, Dict[str, float]] = {
    # (1) this toolkit's XCiT over timm's XCiT plus the plain pyramid, inference time
    'timm_time_ratio': {'max': 1.05},
    # (2) XCiT's peak memory ratio between two resolutions over their pixel ratio
    'memory_over_pixel_ratio': {'tolerance': 0.10},
    # (3) with_cp: the fraction of training peak memory saved and the step time added
    'with_cp_memory_cut': {'min': 0.40},
    'with_cp_time_increase': {'max': 0.35},
    # (4) the linearity check: XCiT's time growth between two resolutions over their pixel ratio,
    # and timm's XCiT plus the plain pyramid over this toolkit's XCiT at the high resolution
    'time_growth_over_pixel_ratio': {'max': 1.10},
    'timm_speedup_high': {'min': 1.20},
}
MEMORY_MEASURES = (('peak_mem_mb', 'added'), ('peak_tensor_mb', 'tensors'))


def met(target: Mapping[str, float], value: float) -> bool:
    """Whether ``value`` meets ``target``: within its ``tolerance`` of 1, or between its ``min`` and ``max``."""
    if 'tolerance' in target:
        return abs(value - 1) <= target['tolerance']
    return target.get('min', -math.inf) <= value <= target.get('max', math.inf)


def _verdict(target: Mapping[str, float], value: float) -> str:
    return 'met' if met(target, value) else 'NOT met'


def compute_ratios(args: argparse.Namespace, rows: List[dict], pair_results: List[Tuple[dict, dict]],
                   targets: Mapping[str, Mapping[str, float]] = TARGETS) -> dict:
    """The three targets from this run's rows and side-by-side timings, with a one-line verdict each.

    Memory targets are given for both measures: the peak memory added (resident size on a CPU)
    and the peak tensor memory.
    """
    timm_t, memory_t = targets['timm_time_ratio'], targets['memory_over_pixel_ratio']
    cut_t, slow_t = targets['with_cp_memory_cut'], targets['with_cp_time_increase']

    def peak(model: str, res: int, mode: str, with_cp: bool = False) -> Optional[dict]:
        for r in rows:
            cp_ok = mode == 'infer' or bool(r['with_cp']) == with_cp  # no checkpointing without grad
            if (r['model'], r['resolution'], r['mode']) == (model, res, mode) and cp_ok and r['status'] == 'ok':
                return {k: r.get(k) for k, _ in MEMORY_MEASURES}
        return None

    out, summary = {'timm': [], 'memory': [], 'with_cp': {}}, []
    for spec, result in pair_results:
        if spec['pair'] != 'timm':
            continue
        entry = dict(model=spec['model'], resolution=spec['resolution'], status=result['status'])
        if result['status'] == 'ok':
            t = result['times_ms']
            entry.update(result)
            summary.append(
                f"(1) {spec['model']} vs timm XCiT + plain pyramid, inference at {spec['resolution']}^2: "
                f"{t['ours']:.0f} / {t['timm']:.0f} ms = **{result['ratio']:.3f}** (target <= {timm_t['max']:.2f}: "
                f"{_verdict(timm_t, result['ratio'])}); with channels_last=True "
                f"{t['ours_channels_last']:.0f} ms = {result['ratio_channels_last']:.3f}")
        else:
            summary.append(f"(1) {spec['model']} at {spec['resolution']}^2: {result.get('note')}")
        out['timm'].append(entry)
    low, high = args.memory_resolutions
    pixel_ratio = (high / low) ** 2
    tolerance = memory_t['tolerance']
    for model in ['xcit_s12_p16'] + [v for v in ('vit_s16', 'mmseg_vit_s16') if v in args.backbones]:
        for mode in ('infer', 'train'):
            a, b = peak(model, high, mode), peak(model, low, mode)
            if not (a and b):
                if mode == 'infer':
                    summary.append(f'(2) {model}: {high}^2 / {low}^2 memory ratio not measured (a run was skipped)')
                continue
            parts = []
            for key, name in MEMORY_MEASURES:
                if a[key] is None or b[key] is None or b[key] <= 0:
                    continue
                ratio = a[key] / b[key]
                out['memory'].append(dict(model=model, mode=mode, measure=key, ratio=ratio,
                                          pixel_ratio=pixel_ratio, low_mb=b[key], high_mb=a[key]))
                verdict = f', {_verdict(memory_t, ratio / pixel_ratio)}' if model.startswith('xcit') else ''
                parts.append(f'{name} {a[key]:.0f} / {b[key]:.0f} MB = **{ratio:.2f}**{verdict}')
            what = 'inference' if mode == 'infer' else 'training'
            target = (f', target within {100 * tolerance:.0f}%: {(1 - tolerance) * pixel_ratio:.2f}-'
                      f'{(1 + tolerance) * pixel_ratio:.2f}' if model.startswith('xcit') else '')
            summary.append(f'(2) {model} {what} peak memory {high}^2 / {low}^2 (pixel ratio {pixel_ratio:.2f}'
                           f'{target}): ' + '; '.join(parts))
    res = args.cp_resolution
    plain, ckpt = peak('xcit_s12_p16', res, 'train'), peak('xcit_s12_p16', res, 'train', True)
    cp_pair = next((r for s, r in pair_results if s['pair'] == 'cp'), None)
    if plain and ckpt:
        parts = []
        for key, name in MEMORY_MEASURES:
            if plain[key] is None or ckpt[key] is None or plain[key] <= 0:
                continue
            cut = 1 - ckpt[key] / plain[key]
            out['with_cp'][key] = dict(plain_mb=plain[key], with_cp_mb=ckpt[key], cut=cut)
            parts.append(f"{name} {plain[key]:.0f} -> {ckpt[key]:.0f} MB, **{100 * cut:.0f}% less** "
                         f"({_verdict(cut_t, cut)})")
        text = (f"(3) xcit_s12_p16 training at {res}^2, with_cp (target >= {100 * cut_t['min']:.0f}% less memory): "
                + '; '.join(parts))
        if cp_pair and cp_pair['status'] == 'ok':
            extra, t = cp_pair['ratio'] - 1, cp_pair['times_ms']
            out['with_cp'].update(time_plain_ms=t['plain'], time_cp_ms=t['with_cp'], time_increase=extra)
            text += (f"; step time {t['plain']:.0f} -> {t['with_cp']:.0f} ms (side by side), "
                     f"**{100 * extra:+.0f}%** (target <= {100 * slow_t['max']:+.0f}%: {_verdict(slow_t, extra)})")
        summary.append(text)
    else:
        summary.append(f'(3) with_cp at {res}^2: not measured (a run was skipped)')
    out['summary'] = summary
    return out
