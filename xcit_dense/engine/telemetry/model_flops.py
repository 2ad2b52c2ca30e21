"""Achieved FLOP/s and model FLOPs utilisation (MFU) of a training run, from the toolkit's counter.

The model's forward is counted once per run (``analysis.flops``, which counts XCA) on one image of
``COUNT_SHAPE`` (a compiled backbone on its eager forward: ``compile.CompiledForward`` runs eagerly
while traced). The counter counts multiply-adds; a FLOP here is half of one, as in the devices'
peak figures. Training is taken as three forwards (the backward computes two products per
forward one); recomputed activations (``with_cp``) are not counted: MFU counts the model's work,
not the work done. Everything but the RoI heads is scaled by each image's pixels (the counter's
figures for XCiT, its pyramid, the necks and dense heads grow with the pixels). The RoI heads work
on a fixed number of regions per image: counted at the test-time proposals of the tensor forward
and scaled to the training sampler's number of RoIs (box and mask heads alike: an approximation,
since the mask head trains on the positive RoIs alone). The images' pixels are counted before
padding to the batch.

MFU = achieved FLOP/s / the device's peak for the dtype in use: bf16 or fp16 under AMP, TF32 when
torch lets float32 matrix products use it, else fp32. ``PEAK_TFLOPS`` holds the dense peaks of
common GPUs by name; ``RankFiguresHook(peak_tflops=...)`` overrides it. A name matches a table entry
when it holds each of the entry's words as a whole word ("RTX A1000" is no A100), the entry with the
most words winning ("H100 NVL" over "H100"). A MIG slice (a name with the word "MIG") has the share
of the whole part's peak that its multiprocessors are of the part's (``FULL_MULTIPROCESSORS``).
"""
import re
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

COUNT_SHAPE = (512, 512)
TRAINING_FORWARDS = 3
# dense (not sparse) peak TFLOP/s by dtype, from the vendors' data sheets; matched against the
# device name by whole words (see the module)
PEAK_TFLOPS: Dict[str, Dict[str, float]] = {
    'H200': dict(bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9),
    'GH200': dict(bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9),  # its GPU: an H100 SXM's figures
    'H200 NVL': dict(bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0),
    'H100': dict(bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9),
    'H100 PCIe': dict(bf16=756.0, fp16=756.0, tf32=378.0, fp32=51.2),
    'H100 NVL': dict(bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0),
    'A100': dict(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
    'L40S': dict(bf16=362.1, fp16=362.1, tf32=183.0, fp32=91.6),
    'A10': dict(bf16=125.0, fp16=125.0, tf32=62.5, fp32=31.2),
    'V100': dict(fp16=125.0, fp32=15.7),
}
# the multiprocessors of the whole part, for the parts that MIG divides (a slice's peak is its share)
FULL_MULTIPROCESSORS: Dict[str, int] = {
    'H200': 132, 'GH200': 132, 'H200 NVL': 132, 'H100': 132, 'H100 PCIe': 114, 'H100 NVL': 132, 'A100': 108,
}


def _words(name: str) -> List[str]:
    return re.findall(r'[a-z0-9]+', name.lower())


def is_mig(device_name: str) -> bool:
    """Whether the device is a MIG slice of a GPU (CUDA names it "<GPU> MIG <profile>")."""
    return 'mig' in _words(device_name)


def table_entry(device_name: str, table: Dict[str, Any]) -> Optional[str]:
    """The table's key for ``device_name``: all its words in the name, the key with the most words."""
    words = set(_words(device_name))
    matches = [key for key in table if set(_words(key)) <= words]
    return max(matches, key=lambda key: len(_words(key)), default=None)


def peak_tflops(device_name: str, dtype: str, table: Optional[Dict[str, Dict[str, float]]] = None,
                multiprocessors: Optional[int] = None) -> Optional[float]:
    """The peak of ``device_name`` for ``dtype`` ('bf16', 'fp16', 'tf32', 'fp32'); None when unknown.

    A MIG slice's peak is the whole part's scaled by ``multiprocessors`` (the slice's, as CUDA's device
    properties give them) over the part's; None where either count is unknown."""
    table = PEAK_TFLOPS if table is None else table
    key = table_entry(device_name, table)
    peak = table[key].get(dtype) if key is not None else None
    if peak is None or not is_mig(device_name):
        return peak
    full = FULL_MULTIPROCESSORS.get(key)
    return peak * multiprocessors / full if full and multiprocessors else None


def training_dtype(optim_wrapper) -> str:
    """The dtype the step's matrix products run in: AMP's cast dtype, else TF32 or fp32."""
    from mmengine.optim import AmpOptimWrapper
    cast = getattr(optim_wrapper, 'cast_dtype', None)
    if cast is not None or isinstance(optim_wrapper, AmpOptimWrapper):
        return 'bf16' if cast in (torch.bfloat16, 'bfloat16') else 'fp16'
    return 'tf32' if torch.backends.cuda.matmul.allow_tf32 else 'fp32'


class TrainingFlops:
    """A model's training FLOPs: per pixel (all but the RoI heads) and per image (the RoI heads)."""

    def __init__(self, per_pixel: float, per_image: float) -> None:
        self.per_pixel, self.per_image = per_pixel, per_image

    def of(self, image_pixels: Sequence[int]) -> float:
        """The training FLOPs of a batch of images with these pixel counts."""
        return sum(self.per_pixel * pixels + self.per_image for pixels in image_pixels)


def training_flops(forward_macs: int, roi_head_macs: int, shape: Sequence[int],
                   roi_scale: float = 1.0) -> TrainingFlops:
    """From one forward's multiply-adds at ``shape`` (``roi_head_macs`` of them the RoI heads'):
    training FLOPs = 2 per multiply-add x 3 forwards; the RoI heads' at ``roi_scale`` times the
    counted regions."""
    height, width = shape
    per_pixel = 2 * TRAINING_FORWARDS * (forward_macs - roi_head_macs) / (height * width)
    return TrainingFlops(per_pixel, 2 * TRAINING_FORWARDS * roi_head_macs * roi_scale)


def roi_scale(model: nn.Module) -> float:
    """Training RoIs per image over the proposals the tensor forward's RoI heads see (1 without RoI heads)."""
    roi_head = getattr(model, 'roi_head', None)
    if roi_head is None:
        return 1.0
    sampled = ((getattr(roi_head, 'train_cfg', None) or {}).get('sampler') or {}).get('num')
    proposals = (getattr(getattr(model, 'rpn_head', None), 'test_cfg', None) or {}).get('max_per_img')
    return sampled / proposals if sampled and proposals else 1.0


def count_training_flops(model: nn.Module, shape: Sequence[int] = COUNT_SHAPE) -> TrainingFlops:
    """Count a detector's or segmentor's forward once at ``shape`` (see the module)."""
    from ...analysis.flops import analyse, dense_inputs
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            inputs, samples = dense_inputs(model, shape)
            device = next(model.parameters()).device
            result = analyse(model, inputs.to(device), samples)
    finally:
        model.train(was_training)
    return training_flops(result.flops, result.part_flops.get('roi_head', 0), shape, roi_scale(model))
