"""ONNX export of an XCiT backbone or of a whole model's tensor forward, checked with onnxruntime.

Exported with ``torch.onnx.export(dynamo=True)``. A backbone keeps the image height and width
dynamic (any size, divisible by 32 or not); a whole model is exported for one input size, since
mmseg's heads bake some sizes of the traced input into the graph (wrong outputs at other sizes).
"""
from typing import List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..io.output_files import writing

BACKBONE_OUTPUTS = ['stride4', 'stride8', 'stride16', 'stride32']


class TensorForward(nn.Module):
    """A detector's or segmentor's ``_forward`` (features to raw head outputs) as a one-input module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor):
        return self.model._forward(image)


def export(module: nn.Module, path: str, shape: Sequence[int], output_names: Optional[List[str]],
           dynamic: bool = True) -> None:
    """Trace ``module`` on a (1, 3, H, W) image and write it to ``path``, H and W dynamic or fixed; a link
    at ``path`` is refused (UnsafeOutputError) before the trace."""
    image = torch.rand(1, 3, *shape)
    dims = {2: torch.export.Dim('height', min=32, max=8192),
            3: torch.export.Dim('width', min=32, max=8192)} if dynamic else None
    with writing(path) as written, torch.no_grad():
        program = torch.onnx.export(module.eval(), (image,), input_names=['image'], output_names=output_names,
                                    dynamo=True, dynamic_shapes=(dims,) if dynamic else None, verbose=False)
        program.save(written)


def max_abs_error(path: str, module: nn.Module, image: torch.Tensor) -> float:
    """The largest difference between onnxruntime's outputs for ``image`` and PyTorch's."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    outputs = session.run(None, {'image': image.numpy()})
    with torch.no_grad():
        expected = module.eval()(image)
    expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    if len(outputs) != len(expected):
        raise ValueError(f'{path} gives {len(outputs)} outputs, PyTorch {len(expected)}')
    return max(float(np.abs(out - ref.numpy()).max()) for out, ref in zip(outputs, expected))


def export_config(config: str, path: str, shape: Sequence[int], checkpoint: Optional[str] = None,
                  whole: bool = False) -> nn.Module:
    """Export a config's backbone (dynamic size) or whole tensor forward (fixed size); returns the module."""
    from ..builder import build_model
    from ..io.weights import read_checkpoint
    from .flops import plain_layers_config
    model = build_model(plain_layers_config(config, {'model.backbone.init_cfg': None}),
                        init=checkpoint is None).eval()
    if checkpoint is not None:
        ckpt = read_checkpoint(checkpoint)
        model.load_state_dict(ckpt.get('state_dict', ckpt))
    if whole:
        module, names = TensorForward(model), None
    else:
        module, names = model.backbone, BACKBONE_OUTPUTS
    export(module, path, shape, names, dynamic=not whole)
    return module
