"""Shared fixtures: tiny XCiT models and timm reference models on shared weights."""
import pytest
import torch

import xcit_dense  # noqa: F401  (registers XCiT)

torch.set_num_threads(2)


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every float parameter and buffer random values, so that no weight goes untested.

    Layer scales get values of order 0.1-0.5 (not the presets' 1e-5), BN statistics are
    non-trivial, so a wrong mapping of any tensor shows in the outputs.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if name.endswith('running_var'):
                tensor.copy_(0.5 + noise.abs())
            elif name.split('.')[-1].startswith('gamma') or name.endswith('temperature'):
                tensor.copy_(0.3 + 0.1 * noise)
            elif name.endswith(('norm1.weight', 'norm2.weight', 'norm3.weight')) or \
                    name.endswith('.1.weight') or name.endswith('bn.weight'):
                tensor.copy_(1.0 + 0.1 * noise)
            else:
                tensor.copy_(0.02 * noise)
    return module


@pytest.fixture
def tiny_xcit():
    """A 4-block, 64-channel XCiT: small enough for every unit test."""
    def build(**kwargs):
        cfg = dict(arch='tiny_12', embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))
        cfg.update(kwargs)
        return xcit_dense.XCiT(**cfg)
    return build
