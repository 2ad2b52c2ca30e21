"""The linearity check: XCiT's time and memory growth between two resolutions against the pixel ratio,
and its speed-up over timm's XCiT plus the same pyramid ops, timed side by side in one process.

Each round runs the four calls (ours and timm's, at the low and the high resolution) once, in
rotating order, so load on the machine hits them alike; times are medians over the rounds. The
memory figure is the peak tensor memory of one inference (the profiler's allocation events).
"""
import os
import statistics
import time
from typing import Dict, List, Tuple

import torch

from xcit_dense.models.xcit import XCiT

from .catalogue import BenchTimmXCiTPyramid
from .measure import tensor_peak_bytes
from .targets import TARGETS, met


def _inference(model: torch.nn.Module, x: torch.Tensor):
    def step() -> None:
        with torch.no_grad():
            model(x)
    return step


def linearity_check(arch: str = 'small_12', patch_size: int = 16, low: int = 1024, high: int = 1600,
                    rounds: int = 5, threads: int = 2) -> dict:
    """Times, growth factors, speed-up and peak tensor memory of one inference at ``low`` and ``high``."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ours = XCiT(arch=arch, patch_size=patch_size)
    ours.init_weights()
    ours.eval()
    timm = BenchTimmXCiTPyramid(arch, patch_size, source=ours).eval()
    inputs = {res: torch.randn(1, 3, res, res) for res in (low, high)}
    calls = {(name, res): _inference(model, inputs[res]) for res in (low, high)
             for name, model in (('ours', ours), ('timm', timm))}
    names = list(calls)
    runs: Dict[Tuple[str, int], List[float]] = {name: [] for name in names}
    load = [os.getloadavg()[0]]
    for i in range(rounds + 1):  # the first round warms up
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            calls[name]()
            if i:
                runs[name].append((time.perf_counter() - start) * 1e3)
    load.append(os.getloadavg()[0])
    ms = {name: statistics.median(v) for name, v in runs.items()}
    memory = {res: tensor_peak_bytes(ours, calls[('ours', res)]) / 2 ** 20 for res in (low, high)}
    pixels = (high / low) ** 2
    growth = ms[('ours', high)] / ms[('ours', low)]
    return dict(arch=arch, patch_size=patch_size, low=low, high=high, rounds=rounds, threads=threads, load=load,
                times_ms={f'{name}@{res}': t for (name, res), t in ms.items()},
                runs_ms={f'{name}@{res}': v for (name, res), v in runs.items()},
                pixel_ratio=pixels, time_growth=growth, timm_time_growth=ms[('timm', high)] / ms[('timm', low)],
                speedup=ms[('timm', high)] / ms[('ours', high)], memory_mb=memory,
                memory_growth=memory[high] / memory[low])


def verdicts(result: dict) -> Dict[str, bool]:
    """Whether each of the three limits in ``TARGETS`` is met."""
    return {'time_growth': met(TARGETS['time_growth_over_pixel_ratio'], result['time_growth'] / result['pixel_ratio']),
            'speedup': met(TARGETS['timm_speedup_high'], result['speedup']),
            'memory_growth': met(TARGETS['memory_over_pixel_ratio'], result['memory_growth'] / result['pixel_ratio'])}


def summary(result: dict) -> str:
    """The check as printed by ``python -m benchmarks backbones --linearity``."""
    low, high, pixels, t = result['low'], result['high'], result['pixel_ratio'], result['times_ms']
    ok = verdicts(result)
    time_max = TARGETS['time_growth_over_pixel_ratio']['max']
    tol = TARGETS['memory_over_pixel_ratio']['tolerance']

    def verdict(key: str) -> str:
        return 'met' if ok[key] else 'NOT met'
    return '\n'.join([
        f"Linearity check: XCiT {result['arch']}/{result['patch_size']} backbone, inference, batch 1, "
        f"{result['threads']} threads, medians of {result['rounds']} rotating rounds; "
        f"load average {result['load'][0]:.1f} -> {result['load'][1]:.1f}",
        f"  {low}^2: ours {t[f'ours@{low}']:.0f} ms, timm XCiT + pyramid {t[f'timm@{low}']:.0f} ms",
        f"  {high}^2: ours {t[f'ours@{high}']:.0f} ms, timm XCiT + pyramid {t[f'timm@{high}']:.0f} ms",
        f"  time growth {low}^2 -> {high}^2: x{result['time_growth']:.2f} (timm x{result['timm_time_growth']:.2f}); "
        f"pixels x{pixels:.2f}, limit x{time_max * pixels:.2f}: {verdict('time_growth')}",
        f"  speed-up over timm at {high}^2: {result['speedup']:.2f}x "
        f"(target >= {TARGETS['timm_speedup_high']['min']:.2f}x): {verdict('speedup')}",
        f"  peak tensor memory {result['memory_mb'][low]:.0f} -> {result['memory_mb'][high]:.0f} MB: "
        f"x{result['memory_growth']:.2f}; within {100 * tol:.0f}% of the pixel ratio: "
        f"x{(1 - tol) * pixels:.2f}-x{(1 + tol) * pixels:.2f}: {verdict('memory_growth')}",
    ])
