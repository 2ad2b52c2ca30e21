"""FLOPs and parameters of XCiT models per part, counted by MMEngine's jit-traced counter.

Convention (as the XCiT paper and fvcore): one multiply-add is one FLOP. MMEngine counts
convolutions, linear layers and matrix products (matmul, bmm, einsum) exactly, norms and
interpolations approximately (a few FLOPs per element), and skips element-wise ops. Two ops
it skips are counted here: the L2 norm of XCA's query/key normalisation (one multiply-add per
element) and ``scaled_dot_product_attention`` (the two matrix products of timm's class attention).
"""
import functools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import elementwise_flop_counter, get_shape
from mmengine.config import Config
from torch import nn

# the parts of a dense model besides the backbone, by attribute name
HEADS = ('neck', 'rpn_head', 'roi_head', 'decode_head', 'auxiliary_head')
# the modules and parameters of an XCiT block, by the part they belong to
BLOCK_PARTS = {'norm1': 'XCA', 'attn': 'XCA', 'gamma1': 'XCA',
               'norm3': 'LPI', 'local_mp': 'LPI', 'gamma3': 'LPI',
               'norm2': 'MLP', 'mlp': 'MLP', 'gamma2': 'MLP'}
CLASSIFIER_PARTS = ('cls_token', 'cls_attn_blocks', 'norm', 'head')
PART_ORDER = ('patch embedding', 'XCA', 'LPI', 'MLP', 'pyramid', 'class attention and head') + HEADS


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """scaled_dot_product_attention: Q K^T and A V, each (..., Lq, E) x (..., E, Lk) products."""
    query, key, value = (get_shape(v) for v in inputs[:3])
    batch = 1
    for size in query[:-2]:
        batch *= size
    return batch * query[-2] * key[-2] * (query[-1] + value[-1])


EXTRA_HANDLES = {
    'aten::linalg_vector_norm': elementwise_flop_counter(1, 0),
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
}


def flop_analyzer(model: nn.Module, inputs: Union[torch.Tensor, Tuple]) -> FlopAnalyzer:
    """MMEngine's FLOP analyzer with the handles above and its warnings off."""
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**EXTRA_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer


def part_of(name: str, prefix: str) -> Optional[str]:
    """The part a module or parameter name belongs to; None for containers that span parts."""
    if not name.startswith(prefix):
        top = name.split('.')[0]
        return top if top in HEADS else None
    first, *rest = name[len(prefix):].split('.')
    if first in ('patch_embed', 'pos_embed'):
        return 'patch embedding'
    if first in ('fpn1', 'fpn2', 'fpn3', 'fpn4'):
        return 'pyramid'
    if first == 'blocks' and len(rest) >= 2:
        return BLOCK_PARTS.get(rest[1])
    if first in CLASSIFIER_PARTS:
        return 'class attention and head'
    return None


@dataclass
class Complexity:
    """FLOPs and parameters of a model, whole and per part; ``skipped`` ops it could not count."""

    flops: int
    params: int
    part_flops: Dict[str, int] = field(default_factory=dict)
    part_params: Dict[str, int] = field(default_factory=dict)
    skipped: Dict[str, int] = field(default_factory=dict)

    @property
    def unattributed_flops(self) -> int:
        return self.flops - sum(self.part_flops.values())

    def table(self) -> str:
        """A Markdown table, GFLOPs and millions of parameters, parts in model order."""
        rows = ['| part | GFLOPs | params (M) |', '|---|---|---|']
        for part, flops in self.part_flops.items():
            rows.append(f'| {part} | {flops / 1e9:.2f} | {self.part_params[part] / 1e6:.2f} |')
        other_params = self.params - sum(self.part_params.values())
        if self.unattributed_flops or other_params:
            rows.append(f'| other | {self.unattributed_flops / 1e9:.2f} | {other_params / 1e6:.2f} |')
        rows.append(f'| **total** | **{self.flops / 1e9:.2f}** | **{self.params / 1e6:.2f}** |')
        return '\n'.join(rows)


def analyse(model: nn.Module, inputs: Union[torch.Tensor, Tuple[torch.Tensor, ...]],
            data_samples: Optional[list] = None) -> Complexity:
    """Count ``model(inputs)`` (a dense model's tensor forward given ``data_samples``) per part."""
    prefix = 'backbone.' if getattr(model, 'backbone', None) is not None else ''
    analyzer = flop_analyzer(model, inputs)
    if data_samples is not None:  # the tracer takes tensors only: bind the samples as mmdet's tool does
        model.forward = functools.partial(type(model).forward, model, data_samples=data_samples)
    try:
        by_module = analyzer.by_module()
    finally:
        if data_samples is not None:
            del model.forward
    part_flops: Dict[str, int] = {}
    part_params: Dict[str, int] = {}
    for name, _ in model.named_modules():
        part = part_of(name, prefix)
        parent = name.rpartition('.')[0]
        if name and part is not None and part_of(parent, prefix) is None:
            part_flops[part] = part_flops.get(part, 0) + by_module.get(name, 0)
    for name, param in model.named_parameters():
        part = part_of(name, prefix)
        if part is not None:
            part_params[part] = part_params.get(part, 0) + param.numel()
    order = [p for p in PART_ORDER if p in part_flops or p in part_params]
    return Complexity(
        flops=analyzer.total(), params=sum(p.numel() for p in model.parameters()),
        part_flops={p: part_flops.get(p, 0) for p in order},
        part_params={p: part_params.get(p, 0) for p in order},
        skipped=dict(analyzer.unsupported_ops()))


def dense_inputs(model: nn.Module, shape: Sequence[int]) -> Tuple[torch.Tensor, list]:
    """The (inputs, data samples) of a detector or segmentor's tensor forward, for one image."""
    height, width = shape
    meta = dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width),
                batch_input_shape=(height, width), scale_factor=(1.0, 1.0))
    if getattr(model, 'roi_head', None) is not None or getattr(model, 'rpn_head', None) is not None:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=meta)
    else:
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=meta)
    return torch.rand(1, 3, height, width), [sample]


def analyse_classifier(name: str, shape: Sequence[int]) -> Complexity:
    """Count timm's ImageNet classifier ``name`` (random weights) on one H x W image."""
    import timm
    model = timm.create_model(name, pretrained=False, img_size=tuple(shape)).eval()
    with torch.no_grad():
        return analyse(model, torch.rand(1, 3, *shape))


def plain_layers_config(config: Union[str, Config], cfg_options: Optional[dict] = None) -> Config:
    """A config with its XCiT backbone's ``fast_layers`` off: counters and exporters see the plain model."""
    from ..builder import load_config
    cfg = load_config(config, cfg_options)
    if cfg.model.get('backbone', {}).get('type') == 'XCiT':
        cfg.model.backbone.fast_layers = False
    return cfg


def analyse_config(config: str, shape: Sequence[int], cfg_options: Optional[dict] = None) -> Complexity:
    """Build a config's model (no pretrained weights, SyncBN as BN, plain layers) and count one H x W image."""
    from ..builder import build_model
    options = {'model.backbone.init_cfg': None, **(cfg_options or {})}
    model = build_model(plain_layers_config(config, options), init=False).eval()
    with torch.no_grad():
        return analyse(model, *dense_inputs(model, shape))
