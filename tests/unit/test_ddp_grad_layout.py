"""The toolkit's DDP wrapper: gradients with their parameters' strides, so that DDP's reducer finds
them laid out as its bucket views (no "Grad strides do not match bucket view strides" warning).

On a CPU the backbone's token maps are channels_last; the depthwise convolutions in its blocks and a
1x1 convolution after it (as the FPN's lateral ones) get weight gradients with channels_last strides.
"""
import warnings

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.registry import MODEL_WRAPPERS
from torch import nn

import xcit_dense.engine  # noqa: F401  (registers the wrapper)
from xcit_dense.engine.planning.run_config import adapt_to_machine
from xcit_dense.engine.training.ddp import same_memory_order

pytestmark = pytest.mark.quick


class BackboneAndLateral(nn.Module):
    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.lateral = nn.Conv2d(64, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.lateral(o).square().mean() for o in self.backbone(x))


def test_gradients_keep_parameter_strides_under_the_toolkits_ddp(tiny_xcit, tmp_path):
    model = BackboneAndLateral(tiny_xcit()).train()
    x = torch.randn(2, 3, 32, 32)
    model(x).backward()  # without the wrapper: some gradients have other strides (the case checked)
    assert any(p.grad.stride() != p.stride() for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)

    cfg = Config(dict(model=dict()))
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0, world_size=1)
    try:
        adapt_to_machine(cfg)
        assert cfg.model_wrapper_cfg.type == 'GradLayoutDDP'
        ddp = MODEL_WRAPPERS.build(dict(cfg.model_wrapper_cfg, module=model))
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # the reducer's warning (once per process) would raise
            for _ in range(2):  # the second step accumulates into the first step's buffers
                ddp.zero_grad()
                ddp(x).backward()
    finally:
        dist.destroy_process_group()
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert p.grad.stride() == p.stride(), name


def test_same_memory_order_ignores_only_dimensions_of_size_one():
    weight = torch.zeros(8, 4, 1, 1)
    assert same_memory_order(weight.to(memory_format=torch.channels_last), weight)
    assert same_memory_order(torch.zeros(8, 4, 1, 1).as_strided((8, 4, 1, 1), (4, 1, 4, 4)), weight)
    dense = torch.zeros(8, 4, 3, 3)
    assert not same_memory_order(dense.to(memory_format=torch.channels_last), dense)
