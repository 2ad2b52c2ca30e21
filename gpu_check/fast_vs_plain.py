"""The GPU check's ``fast_vs_plain`` step: the recipe's XCiT-S12/16 backbone trained with the fast set
and with the plain layers on the device, in bfloat16 and float16 autocast, TF32 off.

Both models start from the same weights and train on the same batches (AdamW, a squared-output loss on
the four pyramid levels; float16 with a gradient scaler, as ``--amp fp16`` runs). The first step's
loss and gradients are compared (losses within rtol = atol = 2e-2; the gradients' difference within
2e-2 of their norm). Under float16 the scaler's first loss scale may overflow the gradients (inf or
NaN, found by ``torch.isfinite``): the scaler would skip that step, so it is left out of the
comparison, said in the dtype's ``skipped_steps``, and taken again on the same batch at the scaler's
next, smaller scale, the same for both models (their weights stay equal), up to ``MAX_SKIPPED``
times; gradients that stay non-finite fail the check. The compared step also warms each model up
(cuBLAS's handles, the caching allocator's blocks), then ``steps - 1`` more are timed (two by
default: a GPU repeats a step of fixed shapes within about 1%, well inside the rule's 5%, and the
step fits the check's 6 minutes) and the device's peak memory read. Whether the fast set should
become the GPU default follows the rule of docs/speed.md: at least 5% faster or 10% lighter, losses
equal, in both dtypes (``fast_default``). ``tiny=True``: a 4-block, 64-channel XCiT at 64x96, on a
CPU too (no peak memory there).
"""
import statistics
import time
from typing import Dict, List, Optional

import torch

from .precision import tf32_off

DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}
TOLERANCE = 2e-2  # losses (rtol = atol) and the gradients' relative difference
FASTER, LIGHTER = 0.95, 0.90  # the rule: fast time at most 0.95x plain's, or peak at most 0.90x
MAX_SKIPPED = 8  # first steps the float16 scaler may skip (each at half the last scale) before the check fails


def _backbone(tiny: bool, fast: bool) -> torch.nn.Module:
    from xcit_dense.models.xcit import XCiT
    if tiny:
        return XCiT(arch='tiny_12', embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), fast_layers=fast)
    return XCiT(arch='small_12', patch_size=16, drop_path_rate=0.05, fast_layers=fast)


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


class _Trainer:
    """One model, its AdamW and (float16) gradient scaler: a training step under autocast."""

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype, init_scale: float):
        self.model, self.device, self.dtype = model.to(device).train(), device, dtype
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=dtype == torch.float16)

    def step(self, x: torch.Tensor) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.dtype):
            outs = self.model(x)
        loss = sum(o.float().square().mean() for o in outs)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        return loss.item()

    def finish(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def gradients_finite(self) -> bool:
        """Whether the step's (unscaled) gradients are all finite: where not, the scaler skips the step."""
        return all(bool(torch.isfinite(p.grad).all()) for p in self.model.parameters() if p.grad is not None)

    def skip(self, scale: float) -> None:
        """Leave the step out (no optimizer step) and go on at ``scale``, as the scaler does after an overflow."""
        self.scaler.update(scale)


def _grad_difference(fast: torch.nn.Module, plain: torch.nn.Module) -> float:
    """|g_fast - g_plain| / |g_plain| over all parameters (L2 norms)."""
    diff = total = 0.0
    for a, b in zip(fast.parameters(), plain.parameters()):
        if b.grad is not None:
            diff += (a.grad.float() - b.grad.float()).square().sum().item()
            total += b.grad.float().square().sum().item()
    return (diff / max(total, 1e-30)) ** 0.5


def _compare(device: torch.device, tiny: bool, dtype: torch.dtype, steps: int,
             init_scale: float) -> Dict[str, object]:
    torch.manual_seed(0)
    plain = _backbone(tiny, fast=False)
    plain.init_weights()
    fast = _backbone(tiny, fast=True)
    fast.load_state_dict(plain.state_dict())
    size = (64, 96) if tiny else (800, 1344)
    batches = [torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(i)).to(device)
               for i in range(steps)]
    trainers = {name: _Trainer(model, device, dtype, init_scale) for name, model in (('plain', plain), ('fast', fast))}
    skipped: List[str] = []
    while True:
        first = {}
        for name, trainer in trainers.items():
            torch.manual_seed(1)  # drop path
            first[name] = trainer.step(batches[0])
        overflowed = [name for name, trainer in trainers.items() if not trainer.gradients_finite()]
        scaler = trainers['plain'].scaler
        if not overflowed or not scaler.is_enabled() or len(skipped) == MAX_SKIPPED:
            break
        scale = scaler.get_scale()
        skipped.append(f"loss scale {scale:g}: {', '.join(overflowed)} overflowed, step skipped and not compared")
        for trainer in trainers.values():
            trainer.skip(scale * scaler.get_backoff_factor())
    result: Dict[str, object] = dict(
        loss_plain=first['plain'], loss_fast=first['fast'],
        grad_difference=_grad_difference(fast, plain), non_finite_gradients=overflowed, skipped_steps=skipped)
    for trainer in trainers.values():
        trainer.finish()
    times: Dict[str, List[float]] = {name: [] for name in trainers}
    peaks: Dict[str, Optional[int]] = {}
    for name, trainer in trainers.items():
        if device.type == 'cuda':
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        for x in batches[1:]:
            _sync(device)
            start = time.perf_counter()
            trainer.step(x)
            trainer.finish()
            _sync(device)
            times[name].append(time.perf_counter() - start)
        peaks[name] = torch.cuda.max_memory_allocated(device) - base if device.type == 'cuda' else None
    for name in trainers:
        result[f'step_s_{name}'] = statistics.median(times[name])
        result[f'peak_bytes_{name}'] = peaks[name]
    result['time_ratio'] = result['step_s_fast'] / result['step_s_plain']
    if peaks['plain']:
        result['peak_ratio'] = peaks['fast'] / peaks['plain']
    for trainer in trainers.values():
        trainer.model.cpu()
    return result


def losses_equal(result: dict) -> bool:
    plain = result['loss_plain']
    return abs(result['loss_fast'] - plain) <= TOLERANCE + TOLERANCE * abs(plain)


def fast_vs_plain(device: torch.device, tiny: bool, steps: int = 3, init_scale: float = 2.0 ** 16) -> dict:
    """Per dtype: both models' first loss, the gradients' relative difference, median step seconds and
    peak bytes (on a GPU) and their ratios, the first steps left out as the float16 scaler skipped
    them (from ``init_scale``, torch's default); ``failed_checks`` where fast and plain disagree or the
    gradients stay non-finite; ``fast_default``: whether the rule of docs/speed.md says the fast set
    should be the GPU default."""
    with tf32_off():
        results = {name: _compare(device, tiny, dtype, steps, init_scale) for name, dtype in DTYPES.items()}
    failed = []
    for name, result in results.items():
        if not losses_equal(result):
            failed.append(f"{name}: first losses differ: fast {result['loss_fast']:.6g}, "
                          f"plain {result['loss_plain']:.6g}")
        if result['non_finite_gradients']:
            failed.append(f"{name}: non-finite gradients ({', '.join(result['non_finite_gradients'])}) in the compared "
                          f"step ({len(result['skipped_steps'])} skipped before it)")
        elif not result['grad_difference'] <= TOLERANCE:
            failed.append(f"{name}: gradients differ by {result['grad_difference']:.3g} of their norm")
    gains = [r['time_ratio'] <= FASTER or r.get('peak_ratio', 1.0) <= LIGHTER for r in results.values()]
    return dict(results, failed_checks=failed, fast_default=not failed and all(gains))
