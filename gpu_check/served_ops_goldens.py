"""Golden outputs and gradients for the ops xcit_mmcv_ext serves beyond NMS and RoIAlign, and the GPU
check's ``served_ops`` step that runs the installed ops (their CUDA path on a GPU) against them.

The ops: DCN and DCNv2 (forward, and the input's, offset's, mask's, weight's and bias's gradients),
MaskedConv2d, RoIPool (forward and backward), the sigmoid and softmax focal losses (loss and the
logits' gradient), bbox_overlaps (IoU and IoF, all pairs and aligned) and multi-scale deformable
attention (forward, and the value's, locations' and weights' gradients).

Where the goldens come from (``source`` in the file and in the step's result):

- ``REFERENCE_SOURCE``, the file in the repository (:func:`make_reference_goldens`, on any CPU): the
  served CPU path in float64, which tests/unit/test_mmcv_ext_ops.py checks against mmcv 2.1.0's own
  test values and a transcription of its CUDA RoIPool kernel, and for the deformable attention mmcv's
  ``multi_scale_deformable_attn_pytorch`` in float64; rounded once to float32.
- ``'compiled mmcv <version> on <GPU>'`` (:func:`make_goldens`, on a GPU with compiled mmcv:
  ``XCIT_MMCV=compiled bash tools/install.sh``; mmcv has CUDA kernels only for RoIPool, the focal
  losses, MaskedConv2d and the deformable attention), which replaces the file and its source.

:func:`compare` runs the installed ops on a device against them, TF32 off: float32 within
``TOLERANCE`` of the golden's largest value (kernels that sum in another order), the sigmoid focal
loss within ``LOOSER`` (its float32 ``log(1 - p)`` for confident logits, as mmcv's kernel computes
it, is that far from float64). Five ops (``FP16_OPS``) are also fed fp16 inputs under fp16 autocast,
as fp16 training feeds them (autocast does not cast the inputs of ``mmcv.ops``' Functions: float32
inputs there would only repeat the float32 rows), and their outputs compared within
``FP16_TOLERANCE`` with the float32 path on the same device fed the same half-rounded inputs (the
goldens hold no rows of half inputs, and rounded RoIs move RoIPool's bins; the float32 rows tie that
path to the goldens). The served ops compute half inputs in float32 and round the result once, on
every device: with them the fp16 rows test that widening and rounding (on a CPU nothing else); with
compiled mmcv, its fp16 kernels. The other ops are compared in float32 only (``FLOAT_ONLY``, with
why). Sampling positions are kept away from whole pixels, where bilinear sampling's gradient has
kinks that two implementations may take apart. The inputs are small (the file is about 400 KB).
"""
from pathlib import Path
from typing import Dict, List, Union

import torch

from .ops_goldens import _row, compiled_mmcv, failures
from .precision import tf32_off

__all__ = ['FLOAT_ONLY', 'GOLDENS', 'REFERENCE_SOURCE', 'compare', 'failures', 'load_goldens', 'make_goldens',
           'make_inputs', 'make_reference_goldens', 'reference_outputs', 'run_ops']

GOLDENS = Path(__file__).with_name('served_ops_goldens.pt')
REFERENCE_SOURCE = 'float64 CPU reference of mmcv 2.1.0 semantics'
TOLERANCE = 1e-4
LOOSER = {'sigmoid_focal': 1e-3}  # float32's log(1 - p) near p = 1 (mmcv's formula): about 3e-4 of the largest loss
FP16_TOLERANCE = 2e-2
FP16_OPS = ('dcn', 'mdcn', 'roi_pool', 'sigmoid_focal', 'ms_deform_attn')
FLOAT_ONLY = {  # the served ops without fp16 rows, and why
    'masked_conv': "its kernels only copy values, in any dtype (the product is torch's addmm), and mmdet's "
                   'guided-anchoring heads call it at inference only',
    'softmax_focal': 'no mmdet or mmseg model calls it (their FocalLoss calls the sigmoid one)',
    'bbox_overlaps': "no mmdet or mmseg model calls mmcv's op (mmdet computes overlaps with its own function)"}


def _fractional(shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Offsets a whole number of pixels plus 0.2 to 0.8: no sample near a whole pixel."""
    return torch.randint(-1, 2, shape, generator=gen).float() + 0.2 + 0.6 * torch.rand(shape, generator=gen)


def make_inputs(seed: int = 0) -> Dict[str, torch.Tensor]:
    """Every case's inputs, on the CPU, float32: DCN over 4 images in chunks of 2 (``im2col_step``),
    RoIs partly outside their map, logits with the background class, three levels of attention."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 8, 6, 8, generator=gen)
    xy = torch.rand(32, 2, generator=gen) * 60
    boxes = torch.cat([xy, xy + 2 + torch.rand(32, 2, generator=gen) * 40], 1)
    rois = torch.cat([torch.randint(0, 2, (24, 1), generator=gen).float(), boxes[:24] * 1.3], 1)
    shapes = torch.tensor([[8, 10], [4, 5], [2, 3]])
    cells = torch.randint(0, 2, (2, 12, 4, 3, 4, 2), generator=gen).float()
    sizes = shapes.flip(1).float()[None, None, None, :, None, :]
    return dict(
        x=x, dcn_weight=torch.randn(16, 4, 3, 3, generator=gen) * 0.1,  # groups 2
        dcn_offset=_fractional((4, 2 * 2 * 9, 6, 8), gen), dcn_mask=torch.rand(4, 2 * 9, 6, 8, generator=gen),
        dcn_bias=torch.randn(16, generator=gen), masked_mask=(torch.rand(1, 6, 8, generator=gen) > 0.5).float(),
        masked_weight=torch.randn(8, 8, 3, 3, generator=gen) * 0.1, masked_bias=torch.randn(8, generator=gen),
        pool_feats=torch.randn(2, 4, 24, 28, generator=gen), rois=rois, boxes=boxes,
        logits=torch.randn(200, 20, generator=gen) * 3, labels=torch.randint(0, 21, (200,), generator=gen),
        class_weight=torch.rand(20, generator=gen) + 0.5,
        value=torch.randn(2, int(shapes.prod(1).sum()), 4, 8, generator=gen), shapes=shapes,
        starts=torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]]),
        locations=((cells + 0.2 + 0.6 * torch.rand(cells.shape, generator=gen)) / sizes).clamp(0, 1),
        attention=torch.rand(2, 12, 4, 3, 4, generator=gen).softmax(-1),
        grad_seed=torch.randn(64, generator=gen))


def _grads(output: torch.Tensor, tensors: List[torch.Tensor], seed: torch.Tensor) -> List[torch.Tensor]:
    """Gradients of a fixed pseudo-random projection of ``output`` (every element weighted)."""
    dtype = torch.promote_types(output.dtype, torch.float32)  # half outputs summed in float32, float64 kept
    weights = seed.repeat(output.numel() // seed.numel() + 1)[:output.numel()].view_as(output).to(dtype)
    return list(torch.autograd.grad((output.to(dtype) * weights).sum(), tensors, allow_unused=True))


def run_ops(inputs: Dict[str, torch.Tensor], device: Union[str, torch.device]) -> Dict[str, torch.Tensor]:
    """The installed ``mmcv.ops`` on ``device``, in the inputs' dtype: outputs and gradients, on the CPU
    in float32."""
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
    feats = t['pool_feats'].clone().requires_grad_()
    pooled = roi_pool(feats, t['rois'], (7, 7), 0.25)
    out['roi_pool'], (out['roi_pool_grad'],) = pooled, _grads(pooled, [feats], seed)
    # mmcv's softmax focal loss has no working backward with reduction 'none' (its gradient's shape)
    for name, loss_fn, weight_, reduction in (('sigmoid_focal', sigmoid_focal_loss, None, 'none'),
                                              ('softmax_focal', softmax_focal_loss, t['class_weight'], 'sum')):
        classes = t['logits'].size(1)  # the sigmoid loss's labels include the background, ``classes``
        labels = t['labels'].clamp(max=classes - 1) if weight_ is not None else t['labels']
        logits = t['logits'].clone().requires_grad_()
        loss = loss_fn(logits, labels, 2.0, 0.25, weight_, reduction)
        out[name], (out[f'{name}_grad'],) = loss, _grads(loss, [logits], seed)
    for mode in ('iou', 'iof'):
        out[f'bbox_{mode}'] = bbox_overlaps(t['boxes'], t['boxes'][:20], mode)
        out[f'bbox_{mode}_aligned'] = bbox_overlaps(t['boxes'][:16], t['boxes'][16:], mode, True)
    value, locations, attention = (t[k].clone().requires_grad_() for k in ('value', 'locations', 'attention'))
    attended = MultiScaleDeformableAttnFunction.apply(value, t['shapes'], t['starts'], locations, attention, 64)
    out['ms_deform_attn'] = attended
    names = ('ms_deform_attn_grad_value', 'ms_deform_attn_grad_locations', 'ms_deform_attn_grad_attention')
    out.update(zip(names, _grads(attended, [value, locations, attention], seed)))
    return {k: v.detach().float().cpu() for k, v in out.items()}


def reference_outputs(inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The served CPU path in float64 (the deformable attention from mmcv's pytorch version), rounded
    once to float32: what mmcv 2.1.0's kernels compute, up to their float32 rounding."""
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    double = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    out = run_ops(double, 'cpu')
    value, locations, attention = (double[k].clone().requires_grad_() for k in ('value', 'locations', 'attention'))
    attended = multi_scale_deformable_attn_pytorch(value, double['shapes'], locations, attention)
    out['ms_deform_attn'] = attended.detach().float()
    names = ('ms_deform_attn_grad_value', 'ms_deform_attn_grad_locations', 'ms_deform_attn_grad_attention')
    grads = _grads(attended, [value, locations, attention], double['grad_seed'])
    out.update((name, grad.float()) for name, grad in zip(names, grads))
    return out


def make_reference_goldens(path: Path = GOLDENS) -> dict:
    """Write the float64 reference (:func:`reference_outputs`) of :func:`make_inputs` to ``path``,
    with ``source`` = ``REFERENCE_SOURCE`` (read weights-only)."""
    import mmcv
    inputs = make_inputs()
    goldens = dict(inputs=inputs, outputs=reference_outputs(inputs), source=REFERENCE_SOURCE,
                   made_with=f'the served ops (mmcv {mmcv.__version__}, torch {torch.__version__}) in float64 on '
                             "a CPU, mmcv's multi_scale_deformable_attn_pytorch for the deformable attention")
    torch.save(goldens, path)
    return goldens


def make_goldens(path: Path = GOLDENS, device: str = 'cuda', require_compiled: bool = True) -> dict:
    """Run compiled mmcv's ops on ``device`` (a GPU: most have CUDA kernels only) and write inputs and
    outputs to ``path``, replacing the reference and its source (read weights-only)."""
    if require_compiled and not compiled_mmcv():
        raise RuntimeError("the goldens are compiled mmcv's: install it first (XCIT_MMCV=compiled bash "
                           "tools/install.sh) on a machine with a GPU")
    import mmcv
    device = torch.device(device)
    where = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'a CPU'
    inputs = make_inputs()
    with tf32_off():
        outputs = run_ops(inputs, device)
    goldens = dict(inputs=inputs, outputs=outputs,
                   source=f'{"compiled" if compiled_mmcv() else "served"} mmcv {mmcv.__version__} on {where}',
                   made_with=f'mmcv {mmcv.__version__} ({"compiled" if compiled_mmcv() else "mmcv-lite"}), '
                             f'torch {torch.__version__}, {where}')
    torch.save(goldens, path)
    return goldens


def load_goldens(path: Path = GOLDENS) -> dict:
    return torch.load(path, map_location='cpu', weights_only=True)


def compare(goldens: dict, device: Union[str, torch.device]) -> dict:
    """The installed ops on ``device`` against ``goldens`` in float32, and ``FP16_OPS`` fed fp16 inputs
    under fp16 autocast against the float32 path fed the same half-rounded inputs, TF32 off (see the
    module): rows, ``all_ok`` over them, where the goldens came from (``source``), the ops compared in
    float32 only (``float_only``) and what the fp16 rows test with the installed ops (``fp16_rows``)."""
    inputs, want = goldens['inputs'], goldens['outputs']
    rounded = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    with tf32_off():
        got = run_ops(inputs, device)
        widened = run_ops({k: v.float() if v.is_floating_point() else v for k, v in rounded.items()}, device)
        with torch.autocast(torch.device(device).type, dtype=torch.float16):
            half = run_ops(rounded, device)
    rows = [_row(name, got[name], want[name], LOOSER.get(name, TOLERANCE)) for name in want]
    rows += [_row(f'{name} of fp16 inputs under fp16 autocast', half[name], widened[name], FP16_TOLERANCE,
                  inputs='float16') for name in FP16_OPS]
    fp16_rows = ("compiled mmcv's fp16 kernels against its float32 path" if compiled_mmcv() else
                 'only the served ops\' widening of fp16 inputs to float32 and the rounding of the result (they '
                 'compute half in float32 on every device; on a CPU these rows test nothing else)')
    return dict(rows=rows, source=goldens.get('source', 'unknown'), made_with=goldens.get('made_with'),
                tolerance=TOLERANCE, looser=LOOSER, fp16_tolerance=FP16_TOLERANCE, float_only=FLOAT_ONLY,
                fp16_rows=fp16_rows, all_ok=all(r['ok'] for r in rows))
