"""Golden outputs and gradients of compiled mmcv 2.1.0's CUDA kernels for the ops xcit_mmcv_ext serves
beyond NMS and RoIAlign, and the GPU check's step that runs the installed ops on a GPU against them.

The ops: DCN and DCNv2 (forward, and the input's, offset's, mask's, weight's and bias's gradients),
MaskedConv2d, RoIPool (forward and backward), the sigmoid and softmax focal losses (loss and the
logits' gradient), bbox_overlaps (IoU and IoF, all pairs and aligned) and multi-scale deformable
attention (forward, and the value's, locations' and weights' gradients). mmcv has CUDA kernels only
for RoIPool, the focal losses, MaskedConv2d and the deformable attention, so the goldens are made on
a GPU with compiled mmcv (``XCIT_MMCV=compiled bash tools/install.sh``, then :func:`make_goldens`,
which writes ``served_ops_goldens.pt`` beside this module); :func:`compare` then runs on any GPU:
float32 within ``TOLERANCE`` of the golden's largest value (float32 kernels that sum in another
order), and the same under fp16 autocast within ``FP16_TOLERANCE``. Sampling positions are kept
away from whole pixels, where bilinear sampling's gradient has kinks that the two may take apart.
"""
from pathlib import Path
from typing import Dict, List, Union

import torch

from .ops_goldens import _row, compiled_mmcv, failures

__all__ = ['GOLDENS', 'compare', 'failures', 'load_goldens', 'make_goldens', 'make_inputs', 'run_ops']

GOLDENS = Path(__file__).with_name('served_ops_goldens.pt')
TOLERANCE = 1e-4
FP16_TOLERANCE = 2e-2


def _fractional(shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Offsets a whole number of pixels plus 0.2 to 0.8: no sample near a whole pixel."""
    return torch.randint(-1, 2, shape, generator=gen).float() + 0.2 + 0.6 * torch.rand(shape, generator=gen)


def make_inputs(seed: int = 0) -> Dict[str, torch.Tensor]:
    """Every case's inputs, on the CPU, float32."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 16, 20, 24, generator=gen)
    xy = torch.rand(64, 2, generator=gen) * 60
    boxes = torch.cat([xy, xy + 2 + torch.rand(64, 2, generator=gen) * 40], 1)
    rois = torch.cat([torch.randint(0, 4, (48, 1), generator=gen).float(), boxes[:48] * 1.3], 1)
    shapes = torch.tensor([[16, 20], [8, 10], [4, 5]])
    cells = torch.randint(0, 4, (2, 30, 8, 3, 4, 2), generator=gen).float()
    sizes = shapes.flip(1).float()[None, None, None, :, None, :]
    return dict(
        x=x, dcn_weight=torch.randn(32, 8, 3, 3, generator=gen) * 0.1,  # groups 2
        dcn_offset=_fractional((4, 2 * 2 * 9, 20, 24), gen), dcn_mask=torch.rand(4, 2 * 9, 20, 24, generator=gen),
        dcn_bias=torch.randn(32, generator=gen), masked_mask=(torch.rand(1, 20, 24, generator=gen) > 0.5).float(),
        masked_weight=torch.randn(8, 16, 3, 3, generator=gen) * 0.1, masked_bias=torch.randn(8, generator=gen),
        rois=rois, boxes=boxes, logits=torch.randn(500, 80, generator=gen) * 3,
        labels=torch.randint(0, 81, (500,), generator=gen), class_weight=torch.rand(80, generator=gen) + 0.5,
        value=torch.randn(2, int(shapes.prod(1).sum()), 8, 32, generator=gen), shapes=shapes,
        starts=torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]]),
        locations=((cells + 0.2 + 0.6 * torch.rand(cells.shape, generator=gen)) / sizes).clamp(0, 1),
        attention=torch.rand(2, 30, 8, 3, 4, generator=gen).softmax(-1),
        grad_seed=torch.randn(64, generator=gen))


def _grads(output: torch.Tensor, tensors: List[torch.Tensor], seed: torch.Tensor) -> List[torch.Tensor]:
    """Gradients of a fixed pseudo-random projection of ``output`` (every element weighted)."""
    weights = seed.repeat(output.numel() // seed.numel() + 1)[:output.numel()].view_as(output).to(output)
    return list(torch.autograd.grad((output.float() * weights.float()).sum(), tensors, allow_unused=True))


def run_ops(inputs: Dict[str, torch.Tensor], device: Union[str, torch.device]) -> Dict[str, torch.Tensor]:
    """The installed ``mmcv.ops`` on ``device``: outputs and gradients, on the CPU in float32."""
    from mmcv.ops import (
        bbox_overlaps,
        deform_conv2d,
        masked_conv2d,
        modulated_deform_conv2d,
        roi_pool,
        sigmoid_focal_loss,
        softmax_focal_loss,
    )
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    t = {k: v.to(device) for k, v in inputs.items()}
    seed, out = t['grad_seed'], {}
    x, offset, mask, weight, bias = (t[k].clone().requires_grad_() for k in
                                     ('x', 'dcn_offset', 'dcn_mask', 'dcn_weight', 'dcn_bias'))
    dcn = deform_conv2d(x, offset, weight, 1, 1, 1, 2, 2, False, 2)
    out['dcn'] = dcn
    out['dcn_grad_x'], out['dcn_grad_offset'], out['dcn_grad_weight'] = _grads(dcn, [x, offset, weight], seed)
    mdcn = modulated_deform_conv2d(x, offset, mask, weight, bias, 1, 1, 1, 2, 2)
    out['mdcn'] = mdcn
    names = ('mdcn_grad_x', 'mdcn_grad_offset', 'mdcn_grad_mask', 'mdcn_grad_weight', 'mdcn_grad_bias')
    out.update(zip(names, _grads(mdcn, [x, offset, mask, weight, bias], seed)))
    out['masked_conv'] = masked_conv2d(t['x'][:1], t['masked_mask'], t['masked_weight'], t['masked_bias'], 1)
    feats = t['x'].clone().requires_grad_()
    pooled = roi_pool(feats, t['rois'], (7, 7), 0.25)
    out['roi_pool'], (out['roi_pool_grad'],) = pooled, _grads(pooled, [feats], seed)
    # mmcv's softmax focal loss has no working backward with reduction 'none' (its gradient's shape)
    for name, loss_fn, weight_, reduction in (('sigmoid_focal', sigmoid_focal_loss, None, 'none'),
                                              ('softmax_focal', softmax_focal_loss, t['class_weight'], 'sum')):
        labels = t['labels'].clamp(max=79) if weight_ is not None else t['labels']
        logits = t['logits'].clone().requires_grad_()
        loss = loss_fn(logits, labels, 2.0, 0.25, weight_, reduction)
        out[name], (out[f'{name}_grad'],) = loss, _grads(loss, [logits], seed)
    for mode in ('iou', 'iof'):
        out[f'bbox_{mode}'] = bbox_overlaps(t['boxes'], t['boxes'][:40], mode)
        out[f'bbox_{mode}_aligned'] = bbox_overlaps(t['boxes'][:32], t['boxes'][32:], mode, True)
    value, locations, attention = (t[k].clone().requires_grad_() for k in ('value', 'locations', 'attention'))
    attended = MultiScaleDeformableAttnFunction.apply(value, t['shapes'], t['starts'], locations, attention, 64)
    out['ms_deform_attn'] = attended
    names = ('ms_deform_attn_grad_value', 'ms_deform_attn_grad_locations', 'ms_deform_attn_grad_attention')
    out.update(zip(names, _grads(attended, [value, locations, attention], seed)))
    return {k: v.detach().float().cpu() for k, v in out.items()}


def make_goldens(path: Path = GOLDENS, device: str = 'cuda', require_compiled: bool = True) -> dict:
    """Run compiled mmcv's ops on ``device`` (a GPU: most have CUDA kernels only) and write inputs and
    outputs to ``path`` (read weights-only)."""
    if require_compiled and not compiled_mmcv():
        raise RuntimeError("the goldens are compiled mmcv's: install it first (XCIT_MMCV=compiled bash "
                           "tools/install.sh) on a machine with a GPU")
    import mmcv
    inputs = make_inputs()
    goldens = dict(inputs=inputs, outputs=run_ops(inputs, device),
                   made_with=f'mmcv {mmcv.__version__} ({"compiled" if compiled_mmcv() else "mmcv-lite"}), '
                             f'torch {torch.__version__}, {torch.device(device).type}')
    torch.save(goldens, path)
    return goldens


def load_goldens(path: Path = GOLDENS) -> dict:
    return torch.load(path, map_location='cpu', weights_only=True)


def compare(goldens: dict, device: Union[str, torch.device]) -> dict:
    """The installed ops on ``device`` against ``goldens`` in float32 and under fp16 autocast: rows,
    and ``all_ok`` over them."""
    inputs, want = goldens['inputs'], goldens['outputs']
    got = run_ops(inputs, device)
    rows = [_row(name, got[name], want[name], TOLERANCE) for name in want]
    with torch.autocast(torch.device(device).type, dtype=torch.float16):
        half = run_ops(inputs, device)
    rows += [_row(f'{name} under fp16 autocast', half[name], want[name], FP16_TOLERANCE)
             for name in ('dcn', 'mdcn', 'roi_pool', 'sigmoid_focal', 'ms_deform_attn')]
    return dict(rows=rows, made_with=goldens.get('made_with'), tolerance=TOLERANCE, fp16_tolerance=FP16_TOLERANCE,
                all_ok=all(r['ok'] for r in rows))
