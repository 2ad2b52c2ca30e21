"""FLOP counting: the paper's classifier figures, exact per-part counts, parts that sum to the whole."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xcit_dense.analysis.flops import analyse, analyse_classifier, analyse_config, plain_layers_config

ROOT_CONFIG = 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py'


@pytest.mark.parametrize('name, paper', [('xcit_tiny_12_p16_224', 1.2), ('xcit_tiny_12_p8_224', 4.8)])
def test_classifier_matches_the_paper(name, paper):
    """timm's classifier at 224^2 counts within 5% of the paper's GFLOPs."""
    gflops = analyse_classifier(name, (224, 224)).flops / 1e9
    assert abs(gflops / paper - 1) < 0.05, gflops


def test_backbone_parts_are_exact_and_sum_to_the_whole(tiny_xcit):
    """Each block part counts its matrix products, L2 norms and LayerNorm; nothing is left over."""
    model = tiny_xcit(fast_layers=False).eval()
    depth, dims, heads = 4, 64, 4
    result = analyse(model, torch.rand(1, 3, 64, 96))
    tokens = (64 // 16) * (96 // 16)
    head_dims = dims // heads
    layer_norm = 5 * tokens * dims  # MMEngine's figure for an affine LayerNorm
    xca = (tokens * dims * 3 * dims + tokens * dims * dims  # qkv, proj
           + 2 * tokens * dims * head_dims  # q k^T and attn v, over all heads
           + 2 * tokens * dims + layer_norm)  # L2 norms of q and k, norm1
    mlp = 2 * tokens * dims * 4 * dims + layer_norm
    assert result.part_flops['XCA'] == depth * xca
    assert result.part_flops['MLP'] == depth * mlp
    assert list(result.part_flops) == ['patch embedding', 'XCA', 'LPI', 'MLP', 'pyramid']
    assert all(result.part_flops.values())
    assert result.unattributed_flops == 0
    assert sum(result.part_params.values()) == result.params


def test_dense_model_parts_sum_to_the_whole():
    """A Semantic FPN's backbone parts, neck and heads add up to its total."""
    options = {'model.backbone.embed_dims': 64, 'model.backbone.depth': 4, 'model.backbone.num_heads': 4,
               'model.backbone.out_indices': (0, 1, 2, 3), 'model.neck.in_channels': [64] * 4}
    result = analyse_config(ROOT_CONFIG, (64, 64), options)
    assert {'neck', 'decode_head', 'pyramid', 'XCA'} <= set(result.part_flops)
    assert result.part_flops['neck'] > 0 and result.part_flops['decode_head'] > 0
    # only the head's resizes run outside a module; they are reported as "other"
    assert 0 <= result.unattributed_flops < 0.01 * result.flops
    assert sum(result.part_flops.values()) + result.unattributed_flops == result.flops
    assert sum(result.part_params.values()) == result.params


def test_configs_are_counted_and_exported_with_the_plain_layers():
    assert plain_layers_config(ROOT_CONFIG).model.backbone.fast_layers is False


class _Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_scaled_dot_product_attention_is_counted():
    """Two products: (Lq x E)(E x Lk) and (Lq x Lk)(Lk x Ev) per batch and head."""
    q, k, v = torch.rand(2, 3, 5, 8), torch.rand(2, 3, 7, 8), torch.rand(2, 3, 7, 4)
    assert analyse(_Attention(), (q, k, v)).flops == 2 * 3 * 5 * 7 * (8 + 4)
