"""Attention maps: XCA maps and value channels of the right shapes and layout, class attention, the tool's files."""

import mmcv
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, randomize_, run_tool_in_process
from timm.models.xcit import Xcit

from xcit_dense.analysis.attention import class_attention_maps, classifier_from_state, xca_maps
from xcit_dense.analysis.attention_plots import load_image


def test_xca_maps_are_softmax_rows_and_values_on_the_grid(tiny_xcit):
    model = randomize_(tiny_xcit()).eval()
    image = torch.rand(1, 3, 64, 96)
    maps = xca_maps(model, image, [0, 3])
    assert set(maps) == {0, 3}
    for block_maps in maps.values():
        assert block_maps.attention.shape == (4, 16, 16)  # heads x d x d, d = 64 / 4
        torch.testing.assert_close(block_maps.attention.sum(-1), torch.ones(4, 16))
        assert block_maps.values.shape == (4, 16, 4, 6)  # heads x d x (64 / 16) x (96 / 16)
    # block 0's values, recomputed by hand from its input tokens
    with torch.no_grad():
        tokens, (hp, wp) = model.patch_embed(image)
        tokens = tokens + model.pos_embed(1, hp, wp).flatten(2).transpose(1, 2)
        block = model.blocks[0]
        v = block.attn.qkv(block.norm1(tokens))[0, :, 128:]
        q, k = block.attn.qkv(block.norm1(tokens))[0, :, :128].split(64, dim=-1)
    torch.testing.assert_close(maps[0].values, v.reshape(hp, wp, 4, 16).permute(2, 3, 0, 1))
    qh, kh = (F.normalize(t.reshape(-1, 4, 16).permute(1, 2, 0), dim=-1) for t in (q, k))
    attention = (qh @ kh.transpose(-2, -1) * block.attn.temperature).softmax(-1)
    torch.testing.assert_close(maps[0].attention, attention)
    top = maps[0].top_channels(1, 3)
    assert torch.equal(top, maps[0].attention[1].sum(0).topk(3).indices)


def authors_layout(model: Xcit) -> dict:
    """timm's weights in the authors' layout: class attention with one qkv projection."""
    state = dict(model.state_dict())
    for i in range(len(model.cls_attn_blocks)):
        for kind in ('weight', 'bias'):
            parts = [state.pop(f'cls_attn_blocks.{i}.attn.{p}.{kind}') for p in 'qkv']
            state[f'cls_attn_blocks.{i}.attn.qkv.{kind}'] = torch.cat(parts)
    return {'model': state}


def tiny_classifier() -> Xcit:
    return randomize_(Xcit(patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)).eval()


def test_classifier_loads_the_authors_layout_and_gives_class_attention():
    model = tiny_classifier()
    loaded = classifier_from_state(authors_layout(model)['model'])
    image = torch.rand(1, 3, 64, 96)
    torch.testing.assert_close(loaded(image), model(image))
    maps = class_attention_maps(loaded, image)
    assert maps.shape == (2, 4, 8, 12)  # class-attention layers x heads x patch grid
    # the class token's softmax row spreads over itself and the patches
    assert ((maps.sum((-1, -2)) > 0) & (maps.sum((-1, -2)) < 1)).all()


def run_tool(*args) -> str:
    """tools/analysis_tools/vis_attention.py as users run it, in this process (no process of its own needed)."""
    proc = run_tool_in_process('tools/analysis_tools/vis_attention.py', *args, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture
def image(tmp_path):
    path = tmp_path / 'street.jpg'
    mmcv.imwrite(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8), str(path))
    return path


def test_tool_on_a_dense_checkpoint(tmp_path, tiny_xcit, image):
    config = tmp_path / 'tiny.py'
    config.write_text(f"_base_ = ['{ROOT}/configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py']\n"
                      "model = dict(backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)),\n"
                      "             neck=dict(in_channels=[64] * 4))\n")
    backbone = randomize_(tiny_xcit())
    checkpoint = tmp_path / 'iter_4.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in backbone.state_dict().items()},
                'meta': {'iter': 4}}, checkpoint)
    out = tmp_path / 'out'
    run_tool(config, checkpoint, image, '--out-dir', out, '--blocks', 1, 3, '--heads', 0, 2,
             '--top-k', 3, '--size', 64, 96)
    expected = {f'street_block{b}_head{h}_{kind}.png' for b in (1, 3) for h in (0, 2) for kind in ('xca', 'channels')}
    assert {p.name for p in out.iterdir()} == expected | {'street_maps.npz'}
    arrays = np.load(out / 'street_maps.npz')
    assert arrays['block3_attention'].shape == (4, 16, 16)
    np.testing.assert_allclose(arrays['block3_attention'].sum(-1), 1, rtol=1e-5)
    assert arrays['block1_values'].shape == (4, 16, 4, 6)
    # the maps are the checkpoint's: the same as those of the backbone it was saved from
    _, batch = load_image(str(image), (64, 96))
    np.testing.assert_allclose(arrays['block3_attention'], xca_maps(backbone.eval(), batch, [3])[3].attention,
                               rtol=1e-4, atol=1e-6)


def test_tool_on_an_imagenet_classifier(tmp_path, image):
    checkpoint = tmp_path / 'xcit_tiny.pth'
    torch.save(authors_layout(tiny_classifier()), checkpoint)
    out = tmp_path / 'out'
    run_tool('-', checkpoint, image, '--out-dir', out, '--size', 64, 64)
    names = {p.name for p in out.iterdir()}
    assert {'street_class_attention.png', 'street_maps.npz', 'street_block1_head3_xca.png'} <= names
    assert np.load(out / 'street_maps.npz')['class_attention'].shape == (2, 4, 8, 8)
