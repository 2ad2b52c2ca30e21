"""Golden outputs of compiled mmcv 2.1.0's NMS and RoIAlign, made once on a CPU, for the GPU check.

With mmcv-lite, ``mmcv._ext`` is the toolkit's, backed by torchvision: comparing a GPU's ops with
the same machine's CPU ops would compare torchvision with itself. The goldens keep what compiled
mmcv computed on the same inputs (``tools/misc/make_ops_goldens.py``, run where compiled mmcv is
installed: ``XCIT_MMCV=compiled bash tools/install.sh``), and :func:`compare` runs the installed
``mmcv.ops`` on any device against them:

- NMS kept indices, exact where no two scores tie and no pair of boxes is at the IoU threshold;
  with tied scores the kept set is recorded, not judged (the order of ties is each kernel's own);
- RoIAlign forward and backward (``aligned`` on and off, ``sampling_ratio`` 0 and 2), within
  ``TOLERANCE`` relative to the largest golden value; the same from a channels_last feature map;
  mmdet's mask targets (``BitmapMasks.crop_and_resize``); no RoIs at all;
- RoIAlign's fp16 kernel fed fp16 features and RoIs (as under fp16 training), forward and backward,
  within ``FP16_TOLERANCE`` of the installed float32 kernel on the CPU fed the same values (the
  half-rounded inputs; the float32 rows tie that kernel to compiled mmcv's goldens, which hold no
  rows of half inputs: compiled mmcv's CPU RoIAlign has no half kernel). NMS is compared in float32
  only (``FLOAT_ONLY``): mmdet runs it on float32 boxes and scores under either precision;
- whether deterministic mode (``torch.use_deterministic_algorithms``) runs RoIAlign's backward
  twice to the same gradient, or refuses it (recorded).
"""
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

__all__ = ['GOLDENS', 'compare', 'compiled_mmcv', 'failures', 'load_goldens', 'make_goldens', 'make_inputs',
           'run_ops']

GOLDENS = Path(__file__).with_name('ops_goldens.pt')
TOLERANCE = 1e-4
FP16_TOLERANCE = 2e-2
NMS_THRESHOLD = 0.7  # the RPN's
ROI_VARIANTS = [(aligned, sampling) for aligned in (True, False) for sampling in (0, 2)]
FLOAT_ONLY = {'nms': 'mmdet casts boxes and scores to float32 before NMS, under fp16 and bf16 alike'}


def _boxes(n: int, size: float, gen: torch.Generator) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen) * size * 0.8
    wh = 1 + torch.rand(n, 2, generator=gen) * size * 0.3
    return torch.cat([xy, xy + wh], 1)


def clear_of_threshold(boxes: torch.Tensor, threshold: float, margin: float = 1e-5) -> torch.Tensor:
    """The boxes whose IoU with every other box is farther than ``margin`` from ``threshold``
    (where float32 kernels that compare ``inter > t * union`` or ``inter / union > t`` agree)."""
    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2]).double()
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:]).double()
    inter = (rb - lt).clamp(min=0).prod(2)
    area = (boxes[:, 2:] - boxes[:, :2]).double().prod(1)
    iou = inter / (area[:, None] + area[None, :] - inter)
    near = (iou - threshold).abs() <= margin
    near.fill_diagonal_(False)
    return ~near.any(1)


def make_inputs(seed: int = 0) -> Dict[str, torch.Tensor]:
    """The cases' inputs: RPN-sized NMS sets (unique and tied scores), a feature map with RoIs
    partly outside it, ground-truth masks with their RoIs."""
    gen = torch.Generator().manual_seed(seed)
    boxes = _boxes(2000, 200.0, gen)
    boxes = boxes[clear_of_threshold(boxes, NMS_THRESHOLD)]
    scores = torch.randperm(len(boxes), generator=gen).float() / len(boxes)  # unique
    tied = (torch.rand(len(boxes), generator=gen) * 16).floor() / 16  # 16 levels
    feats = torch.randn(2, 8, 40, 40, generator=gen)
    rois = torch.cat([torch.randint(0, 2, (48, 1), generator=gen).float(), _boxes(48, 180.0, gen)], 1)
    rois[:4, 1:] = torch.tensor([[-20.0, -20, 30, 30], [150, 150, 220, 210], [10, 10, 10, 10], [200, 5, 260, 40]])
    masks = (torch.rand(6, 64, 64, generator=gen) > 0.5).to(torch.uint8)
    mask_boxes = _boxes(12, 60.0, gen)
    return dict(boxes=boxes, scores=scores, tied_scores=tied, labels=torch.randint(0, 5, (len(boxes),), generator=gen),
                feats=feats, rois=rois, grad_weights=torch.randn(48, 8, 7, 7, generator=gen),
                masks=masks, mask_boxes=mask_boxes, mask_inds=torch.randint(0, 6, (12,), generator=gen))


def _roi_align(feats: torch.Tensor, rois: torch.Tensor, weights: torch.Tensor, aligned: bool,
               sampling: int) -> Dict[str, torch.Tensor]:
    from mmcv.ops import roi_align
    feats = feats.detach().requires_grad_(True)
    out = roi_align(feats, rois, (7, 7), 0.2, sampling, 'avg', aligned)
    (out.float() * weights).sum().backward()
    return dict(out=out.detach(), grad=feats.grad.detach())


def run_ops(inputs: Dict[str, torch.Tensor], device: Union[str, torch.device]) -> Dict[str, torch.Tensor]:
    """The installed ``mmcv.ops`` (and mmdet's mask targets) on ``device``, in float32; outputs on the CPU."""
    from mmcv.ops import batched_nms, nms
    from mmdet.structures.mask import BitmapMasks
    x = {k: v.to(device) for k, v in inputs.items()}
    out = dict(nms_keep=nms(x['boxes'], x['scores'], NMS_THRESHOLD)[1],
               nms_tied_keep=nms(x['boxes'], x['tied_scores'], NMS_THRESHOLD)[1],
               batched_nms_keep=batched_nms(x['boxes'], x['scores'], x['labels'],
                                            dict(type='nms', iou_threshold=NMS_THRESHOLD))[1])
    for aligned, sampling in ROI_VARIANTS:
        result = _roi_align(x['feats'], x['rois'], x['grad_weights'], aligned, sampling)
        out[f'roi_align_{aligned}_{sampling}'] = result['out']
        out[f'roi_align_grad_{aligned}_{sampling}'] = result['grad']
    masks = BitmapMasks(inputs['masks'].numpy(), 64, 64)
    out['mask_targets'] = masks.crop_and_resize(x['mask_boxes'], (28, 28), inputs['mask_inds'].numpy(),
                                                device=device).to_tensor(torch.float32, device)
    return {k: v.detach().cpu() for k, v in out.items()}


def compiled_mmcv() -> bool:
    """Whether ``mmcv._ext`` is compiled mmcv's extension (not the toolkit's, from torchvision)."""
    import mmcv._ext as ext
    return str(getattr(ext, '__file__', '')).endswith('.so')


def make_goldens(path: Path = GOLDENS, require_compiled: bool = True) -> dict:
    """Run the ops on the CPU and write inputs and outputs to ``path`` (read weights-only)."""
    if require_compiled and not compiled_mmcv():
        raise RuntimeError('the goldens are compiled mmcv\'s: install it first (XCIT_MMCV=compiled bash '
                           'tools/install.sh)')
    import mmcv
    inputs = make_inputs()
    goldens = dict(inputs=inputs, outputs=run_ops(inputs, 'cpu'),
                   made_with=f'mmcv {mmcv.__version__} ({"compiled" if compiled_mmcv() else "mmcv-lite"}), '
                             f'torch {torch.__version__}, CPU')
    torch.save(goldens, path)
    return goldens


def load_goldens(path: Path = GOLDENS) -> dict:
    return torch.load(path, map_location='cpu', weights_only=True)


def _row(name: str, got: torch.Tensor, want: torch.Tensor, tolerance: Optional[float], judged: bool = True,
         inputs: str = 'float32') -> dict:
    """One comparison: exact when ``tolerance`` is None, else relative to the golden's largest value;
    ``inputs``: the dtype of the inputs the op was fed."""
    got, want = got.detach().cpu(), want.detach().cpu()
    row = dict(op=name, inputs=inputs, shape=list(got.shape), judged=judged)
    if got.shape != want.shape:
        return dict(row, ok=not judged, detail=f'shape {list(got.shape)}, golden {list(want.shape)}')
    if tolerance is None:
        same = torch.equal(got, want)
        row.update(ok=same or not judged, same=same)
        if not same:
            row['detail'] = f'{int((got != want).sum())} of {got.numel()} differ'
        return row
    scale = float(want.abs().max()) if want.numel() else 0.0
    diff = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    rel = diff / scale if scale else diff
    return dict(row, max_rel_diff=rel, ok=(rel <= tolerance) or not judged)


def compare(goldens: dict, device: Union[str, torch.device]) -> dict:
    """The installed ops on ``device`` against ``goldens``: rows, and ``all_ok`` over the judged ones."""
    from mmcv.ops import nms, roi_align
    inputs, want = goldens['inputs'], goldens['outputs']
    got = run_ops(inputs, device)
    rows: List[dict] = [_row('nms kept indices (unique scores)', got['nms_keep'], want['nms_keep'], None),
                        _row('batched_nms kept indices', got['batched_nms_keep'], want['batched_nms_keep'], None)]
    tied = _row('nms kept set (tied scores: recorded, not judged)', got['nms_tied_keep'].sort()[0],
                want['nms_tied_keep'].sort()[0], None, judged=False)
    rows.append(tied)
    for aligned, sampling in ROI_VARIANTS:
        key = f'{aligned}_{sampling}'
        rows.append(_row(f'roi_align aligned={aligned} sampling={sampling}', got[f'roi_align_{key}'],
                         want[f'roi_align_{key}'], TOLERANCE))
        rows.append(_row(f'roi_align backward aligned={aligned} sampling={sampling}', got[f'roi_align_grad_{key}'],
                         want[f'roi_align_grad_{key}'], TOLERANCE))
    feats = inputs['feats'].to(device).contiguous(memory_format=torch.channels_last)
    result = _roi_align(feats, inputs['rois'].to(device), inputs['grad_weights'].to(device), True, 0)
    rows.append(_row('roi_align from channels_last features', result['out'], want['roi_align_True_0'], TOLERANCE))
    rows.append(_row('roi_align backward from channels_last features', result['grad'],
                     want['roi_align_grad_True_0'], TOLERANCE))
    rows.append(_row('mask targets (crop_and_resize)', got['mask_targets'], want['mask_targets'], TOLERANCE))
    no_rois = roi_align(inputs['feats'].to(device), inputs['rois'][:0].to(device), (7, 7), 0.2, 0, 'avg', True)
    rows.append(_row('roi_align of no RoIs', no_rois, torch.zeros(0, 8, 7, 7), None))
    empty_keep = nms(inputs['boxes'][:0].to(device), inputs['scores'][:0].to(device), NMS_THRESHOLD)[1]
    rows.append(_row('nms of no boxes', empty_keep, torch.zeros(0, dtype=want['nms_keep'].dtype), None))
    rows += _half_rows(inputs, device)
    return dict(rows=rows, made_with=goldens.get('made_with'), tolerance=TOLERANCE, fp16_tolerance=FP16_TOLERANCE,
                float_only=FLOAT_ONLY, deterministic=_deterministic_backward(inputs, device),
                all_ok=all(r['ok'] for r in rows))


def _half_rows(inputs: Dict[str, torch.Tensor], device: Union[str, torch.device]) -> List[dict]:
    """RoIAlign's fp16 kernel on ``device`` fed fp16 features, RoIs and output gradients, against
    the installed float32 kernel on the CPU fed the same (half-rounded) values."""
    half = {k: inputs[k].half() for k in ('feats', 'rois', 'grad_weights')}
    reference = _roi_align(*(half[k].float() for k in ('feats', 'rois', 'grad_weights')), True, 0)
    got = _roi_align(*(half[k].to(device) for k in ('feats', 'rois', 'grad_weights')), True, 0)
    if got['out'].dtype != torch.float16:
        raise RuntimeError(f"roi_align of fp16 inputs returned {got['out'].dtype}")
    return [_row('roi_align of fp16 inputs', got['out'], reference['out'], FP16_TOLERANCE, inputs='float16'),
            _row('roi_align backward of fp16 inputs', got['grad'], reference['grad'], FP16_TOLERANCE,
                 inputs='float16')]


def _deterministic_backward(inputs: Dict[str, torch.Tensor], device: Union[str, torch.device]) -> str:
    """What deterministic mode does with RoIAlign's backward on ``device``: repeats it exactly, or refuses."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [_roi_align(inputs['feats'].to(device), inputs['rois'].to(device), inputs['grad_weights'].to(device),
                           True, 0)['grad'] for _ in range(2)]
        return 'same gradient twice' if torch.equal(*runs) else 'gradients differ between two runs'
    except RuntimeError as exc:
        return f'refused: {str(exc).splitlines()[0][:200]}'
    finally:
        torch.use_deterministic_algorithms(before)


def failures(result: dict) -> List[str]:
    """The judged rows that failed, named with what differed."""
    return [f"{r['op']}: {r.get('detail') or 'max relative difference %.3g' % r.get('max_rel_diff', float('nan'))}"
            for r in result['rows'] if not r['ok']]

