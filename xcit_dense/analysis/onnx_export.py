"""ONNX export of an XCiT backbone or of a whole model's tensor forward, checked with onnxruntime.

Exported with ``torch.onnx.export(dynamo=True)``. A backbone, a segmentor (UperNet, Semantic FPN) and
a Mask R-CNN's whole prediction (``onnx_detector``) keep the image height and width dynamic (any size,
divisible by 32 or not); another detector's tensor forward is exported for one input size. Two of
mmseg's layers bake the traced size into the graph (wrong outputs at other sizes), so a segmentor is
exported through a copy in which they are replaced by equal layers that keep it symbolic
(``dynamic_size_copy``); training is unchanged.
"""
import copy
import json
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.config import Config
from torch import nn

from ..io.output_files import writing
from .onnx_detector import DETECTOR_OUTPUTS, DetectorForward, is_mask_rcnn

BACKBONE_OUTPUTS = ['stride4', 'stride8', 'stride16', 'stride32']
SEGMENTOR_OUTPUTS = ['logits', 'labels']
# --check on images: onnxruntime's and PyTorch's label maps agree on this share of the pixels at least
# (argmax ties of float rounding may differ), their logits by at most this much
MIN_PIXEL_AGREEMENT = 0.999
MAX_LOGITS_DIFFERENCE = 1e-3


class TensorForward(nn.Module):
    """A detector's or segmentor's ``_forward`` (features to raw head outputs) as a one-input module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor):
        return self.model._forward(image)


class ScaledUpsample(nn.Module):
    """mmseg's ``Upsample`` by a whole factor, its output size computed in integers: mmseg's computes
    ``int(size * factor)`` in floats, which the exporter can only evaluate at the traced size."""

    def __init__(self, factor: int, mode: str, align_corners: Optional[bool]) -> None:
        super().__init__()
        self.factor, self.mode, self.align_corners = factor, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[-2] * self.factor, x.shape[-1] * self.factor)
        return F.interpolate(x, size=size, mode=self.mode, align_corners=self.align_corners)


class BinMeanPool(nn.Module):
    """``nn.AdaptiveAvgPool2d`` to a fixed grid as per-bin means over slices of the input: bin ``i`` of
    ``n`` over a side of ``s`` covers ``floor(i*s/n)`` to ``ceil((i+1)*s/n)``, as PyTorch's does. The
    exporter's decomposition of the adaptive pool chooses kernels from the traced size."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.rows, self.cols = rows, cols

    @staticmethod
    def _bins(x: torch.Tensor, dim: int, count: int) -> torch.Tensor:
        side = x.shape[dim]
        return torch.stack([x.narrow(dim, i * side // count, ((i + 1) * side + count - 1) // count - i * side // count)
                            .mean(dim) for i in range(count)], dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._bins(self._bins(x, -2, self.rows), -1, self.cols)


def _replacement(module: nn.Module) -> Optional[nn.Module]:
    """The size-keeping layer equal to ``module``, or None where it needs none."""
    from mmseg.models.utils import Upsample
    if isinstance(module, Upsample) and not module.size and float(module.scale_factor).is_integer():
        return ScaledUpsample(int(module.scale_factor), module.mode, module.align_corners)
    if isinstance(module, nn.AdaptiveAvgPool2d):
        size = module.output_size
        rows, cols = (size, size) if isinstance(size, int) else size
        if isinstance(rows, int) and isinstance(cols, int):
            return BinMeanPool(rows, cols)
    return None


def dynamic_size_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (its weights' values) whose layers that would fix the exported size are
    replaced by equal ones that keep it symbolic (``ScaledUpsample``, ``BinMeanPool``)."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        new = _replacement(module)
        if new is not None:
            parent, _, child = name.rpartition('.')
            setattr(model.get_submodule(parent), child, new)
    return model


class SegmentorForward(nn.Module):
    """A segmentor's prediction for a normalised image, as mmseg's ``predict`` computes it before
    its resizing to the original image: logits at the input's size (bilinear from the head's
    stride 4) and their argmax, the label map."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        head = self.model.decode_head
        logits = F.interpolate(head.forward(self.model.extract_feat(image)), size=image.shape[2:],
                               mode='bilinear', align_corners=head.align_corners)
        return logits, logits.argmax(1)


def export(module: nn.Module, path: str, shape: Sequence[int], output_names: Optional[List[str]],
           dynamic: bool = True, metadata: Optional[Dict[str, str]] = None) -> None:
    """Trace ``module`` on a (1, 3, H, W) image and write it to ``path``, H and W dynamic or fixed, with
    ``metadata`` as the file's ``metadata_props``; a link at ``path`` is refused (UnsafeOutputError)
    before the trace. The graph is optimised as the exporter optimises it, its repeated subexpressions
    merged first (``optimize``)."""
    image = torch.rand(1, 3, *shape)
    dims = {2: torch.export.Dim('height', min=32, max=8192),
            3: torch.export.Dim('width', min=32, max=8192)} if dynamic else None
    with writing(path) as written, torch.no_grad():
        program = torch.onnx.export(module.eval(), (image,), input_names=['image'], output_names=output_names,
                                    dynamo=True, dynamic_shapes=(dims,) if dynamic else None, optimize=False,
                                    verbose=False)
        optimize(program)
        program.model.metadata_props.update(metadata or {})
        program.save(written)


def optimize(program: torch.onnx.ONNXProgram) -> None:
    """The exporter's own optimisation of ``program`` (constant folding, onnxscript's rewrite rules),
    after merging its repeated subexpressions: the exporter's graph computes each symbolic size again
    where it is used (a small Mask R-CNN's: 2,582 nodes, about 1,400 once merged), and the rewrite
    rules are matched node by node. Measured on that model (one thread, CPU seconds): 18 of the
    export's 123 on the graph as exported, 9 of 114 once merged; the rest is torch.export's tracing."""
    from onnxscript import ir
    ir.passes.common.CommonSubexpressionEliminationPass()(program.model)
    program.optimize()


def onnx_outputs(path: str, image: torch.Tensor) -> List[np.ndarray]:
    """onnxruntime's outputs of the file at ``path`` for ``image``, on the CPU."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    return session.run(None, {'image': image.numpy()})


def max_abs_error(path: str, module: nn.Module, image: torch.Tensor) -> float:
    """The largest difference between onnxruntime's outputs for ``image`` and PyTorch's."""
    outputs = onnx_outputs(path, image)
    with torch.no_grad():
        expected = module.eval()(image)
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    if len(outputs) != len(expected):
        raise ValueError(f'{path} gives {len(outputs)} outputs, PyTorch {len(expected)}')
    return max(float(np.abs(out - ref.numpy()).max()) for out, ref in zip(outputs, expected))


def check_segmentation(path: str, module: nn.Module, images: Sequence[str]) -> List[dict]:
    """onnxruntime's file at ``path`` beside ``module`` (``SegmentorForward``) on each image, prepared as
    ``tools/deployment/infer_onnx.py`` prepares it from the file's metadata: per image the share of pixels whose
    labels agree, the logits' largest difference and whether both are within ``MIN_PIXEL_AGREEMENT``
    and ``MAX_LOGITS_DIFFERENCE``. An image that cannot be read raises ValueError or FileNotFoundError."""
    from xcit_launch.onnx_segmentation import SegmentationModel, read_image

    from ..pixel_limit import DEFAULT_MAX_BYTES
    runtime = SegmentationModel(path)
    rows = []
    for image_path in images:
        image = runtime.network_input(read_image(image_path, DEFAULT_MAX_BYTES))
        logits, labels = runtime.session.run(SEGMENTOR_OUTPUTS, {'image': image})
        with torch.no_grad():
            expected_logits, expected_labels = module.eval()(torch.from_numpy(image))
        agreement = float((labels == expected_labels.numpy()).mean())
        difference = float(np.abs(logits - expected_logits.numpy()).max())
        rows.append(dict(image=image_path, pixel_agreement=agreement, logits_difference=difference,
                         within=agreement >= MIN_PIXEL_AGREEMENT and difference <= MAX_LOGITS_DIFFERENCE))
    return rows


def prediction_metadata(cfg, model: nn.Module, task: str) -> Dict[str, str]:
    """What a caller needs beside the file, as JSON strings: the ``task`` (segmentation or detection),
    the classes and their palette (the checkpoint's, else the test set's), the normalisation (``mean``,
    ``std``, ``bgr_to_rgb``: the image goes in as float32 (1, 3, H, W), normalised) and the test
    pipeline's ``Resize`` (``scale``, ``keep_ratio``), which the caller applies before normalising; a
    detector's ``mask_thr_binary`` beside them."""
    if task == 'detection':
        from mmdet.registry import DATASETS
    else:
        from mmseg.registry import DATASETS

    from ..datasets.palette import complete_palette
    dataset = cfg.test_dataloader.dataset
    meta = dict(getattr(DATASETS.get(dataset.type), 'METAINFO', {}))
    meta.update(dataset.get('metainfo') or {})
    meta.update(getattr(model, 'dataset_meta', None) or {})
    classes = list(meta.get('classes') or ())
    palette = complete_palette(classes, meta.get('palette')) or meta.get('palette') or []
    resize = next((step for step in dataset.pipeline if step['type'] == 'Resize'), {})
    pre = cfg.model.data_preprocessor
    values = dict(task=task, classes=classes, palette=[[int(v) for v in c] for c in palette],
                  mean=list(pre.get('mean') or [0, 0, 0]), std=list(pre.get('std') or [1, 1, 1]),
                  bgr_to_rgb=bool(pre.get('bgr_to_rgb', False)),
                  scale=list(resize['scale']) if 'scale' in resize else None,
                  keep_ratio=bool(resize.get('keep_ratio', False)))
    if task == 'detection':
        values['mask_thr_binary'] = float(cfg.model.test_cfg.rcnn.mask_thr_binary)
    return {key: json.dumps(value) for key, value in values.items()}


def export_config(config: Union[str, Config], path: str, shape: Sequence[int], checkpoint: Optional[str] = None,
                  whole: bool = False, dataset_meta: Optional[dict] = None) -> nn.Module:
    """Export a config's backbone (dynamic size) or whole model: a segmentor's logits and label map
    (``SegmentorForward``, dynamic size, with ``prediction_metadata``), a Mask R-CNN's detections
    (``DetectorForward``, dynamic size, with ``prediction_metadata``), another detector's tensor forward
    (fixed size). The weights are the checkpoint's ``state_dict`` (of a run trained with ``--ema``, the
    average: ``io/averaged_weights.py``); ``dataset_meta`` (a published model's classes and palette) in
    place of the checkpoint's. Returns the exported PyTorch module (the model as built, not the export's
    copy)."""
    from ..builder import build_model
    from ..io.weights import read_checkpoint
    from ..tasks import task_of_config
    from .flops import plain_layers_config
    cfg = plain_layers_config(config, {'model.backbone.init_cfg': None})
    model = build_model(cfg, init=checkpoint is None).eval()
    if checkpoint is not None:
        ckpt = read_checkpoint(checkpoint)
        model.load_state_dict(ckpt.get('state_dict', ckpt))
        model.dataset_meta = (ckpt.get('meta') or {}).get('dataset_meta')
    if dataset_meta:
        model.dataset_meta = dict(dataset_meta)
    if not whole:
        export(model.backbone, path, shape, BACKBONE_OUTPUTS)
        return model.backbone
    if task_of_config(cfg).name == 'segmentation':
        export(SegmentorForward(dynamic_size_copy(model)), path, shape, SEGMENTOR_OUTPUTS,
               metadata=prediction_metadata(cfg, model, 'segmentation'))
        return SegmentorForward(model)
    if is_mask_rcnn(model):
        export(DetectorForward(model), path, shape, DETECTOR_OUTPUTS,
               metadata=prediction_metadata(cfg, model, 'detection'))
        return DetectorForward(model)
    export(TensorForward(model), path, shape, None, dynamic=False)
    return TensorForward(model)
