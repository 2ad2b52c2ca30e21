"""--auto-fit's arithmetic: the largest padded input of the recipes' pipelines, the candidate plans, the
memory held beside the probe's peak, and when a recorded fit may be reused."""
import argparse

import pytest
from helpers import ROOT
from mmengine.config import Config
from torch import nn

from xcit_dense.builder import load_config
from xcit_dense.engine.planning.auto_fit import (
    AutoFitError,
    FitRecord,
    candidates,
    device_record,
    extra_bytes,
    fit,
    probe_shape,
)
from xcit_dense.engine.planning.batch_plan import BatchPlan, resolve_batch_plan
from xcit_dense.engine.planning.run_config import fit_batch_to_memory
from xcit_dense.tasks import task_of_config

pytestmark = pytest.mark.quick


@pytest.mark.parametrize('config, shape', [
    # multi-scale resize to at most 1333 x 800, padded to 32 (1344 x 800); batches grouped by aspect ratio
    ('configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py', (800, 1344)),
    # RandomResize of (2048, 512) up to 2x, cropped to 512 x 512, padded to size (512, 512)
    ('configs/xcit/upernet_xcit_small_12_p16_160k_ade20k.py', (512, 512)),
    # large-scale jitter of (1024, 1024) up to 2x, cropped to 1024 x 1024; batches not grouped: a square
    ('configs/examples/mask2former_xcit_tiny_12_p16_lsj_50e_coco.py', (1024, 1024)),
])
def test_probe_shape_of_the_recipes(config, shape):
    assert probe_shape(Config.fromfile(ROOT / config)) == shape


def test_probe_shape_takes_the_largest_branch_and_squares_ungrouped_batches():
    cfg = Config(dict(
        model=dict(data_preprocessor=dict(pad_size_divisor=32)),
        train_dataloader=dict(dataset=dict(type='SkipBadSamples', dataset=dict(pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='RandomChoice', transforms=[
                [dict(type='Resize', scale=(1000, 600), keep_ratio=True)],
                [dict(type='RandomResize', scale=[(900, 500), (1100, 700)], keep_ratio=True),
                 dict(type='RandomCrop', crop_size=(640, 640))]]),
        ])))))
    assert probe_shape(cfg) == (1024, 1024)  # long side 1000 (the first branch), rounded up to 32, squared


def test_probe_shape_asks_for_the_shape_when_the_pipeline_does_not_bound_it():
    cfg = Config(dict(model=dict(), train_dataloader=dict(dataset=dict(pipeline=[dict(type='LoadImageFromFile')]))))
    with pytest.raises(AutoFitError, match=r'does not bound the image size .* set auto_fit.probe_shape'):
        probe_shape(cfg)
    cfg.auto_fit = dict(probe_shape=(480, 640))
    assert probe_shape(cfg) == (480, 640)
    cfg.auto_fit = dict(probe_shape=640)
    with pytest.raises(AutoFitError, match=r'must be \(height, width\) in pixels, got 640'):
        probe_shape(cfg)


def test_candidates_keep_images_times_accumulation():
    assert candidates(2, 1) == [(2, 1), (1, 2)]
    assert candidates(4, 2) == [(4, 2), (2, 4), (1, 8)]
    assert candidates(3, 2) == [(3, 2), (2, 3), (1, 6)]
    assert candidates(1, 8) == [(1, 8)]


def test_a_recorded_fit_is_reused_only_for_the_same_request_world_size_and_device():
    recorded = FitRecord((2, 1), (1, 2), 8, 'NVIDIA H100 80GB HBM3', 85 * 2**30)
    assert recorded.differs_from(FitRecord((2, 1), None, 8, 'NVIDIA H100 80GB HBM3', 85 * 2**30)) is None
    assert recorded.differs_from(FitRecord((2, 1), None, 16, 'NVIDIA H100 80GB HBM3', 85 * 2**30)) == \
        'the world size changed (8 -> 16)'
    assert recorded.differs_from(FitRecord((4, 1), None, 8, 'NVIDIA H100 80GB HBM3', 85 * 2**30)) == \
        'the requested plan (images per GPU, accumulation) changed ((2, 1) -> (4, 1))'
    assert 'the device changed' in recorded.differs_from(FitRecord((2, 1), None, 8, 'NVIDIA A100', 85 * 2**30))
    assert recorded.as_meta() == dict(requested=[2, 1], fitted=[1, 2], world_size=8,
                                      device='NVIDIA H100 80GB HBM3', total_memory=85 * 2**30)


def test_a_recorded_fit_becomes_the_requested_plan_at_the_fitted_batch():
    """A resume with the same request, world size and device: no probe; the requested plan (LR scaling on)
    re-planned for the recorded 1 image x accumulation 2, written to the loader and recorded again."""
    cfg = Config.fromfile(ROOT / 'configs/xcit/upernet_xcit_small_12_p16_160k_ade20k.py')  # 2 images per GPU
    args = argparse.Namespace(auto_fit=True, amp=None, ema=None)
    requested = resolve_batch_plan(cfg, 1, scale_lr=True)
    record = FitRecord((2, 1), (1, 2), 1, *device_record())
    plan, lines = fit_batch_to_memory(cfg, args, requested, dict(meta=dict(auto_fit=record.as_meta())))
    assert plan == BatchPlan(1, 1, 2, requested.reference_batch, requested.base_lr, scale_lr=True)
    assert lines == ['auto-fit: 1 images per GPU x accumulation 2, as the checkpoint recorded for the same '
                     'request, world size and device (not probed)']
    assert cfg.train_dataloader.batch_size == 1
    assert cfg.custom_hooks[-1] == dict(type='AutoFitHook', record=record.as_meta())


def test_the_memory_beside_the_probe_counts_the_ema_copy_of_parameters_and_buffers():
    """AdamW: buckets and two moments per trained parameter (4 copies); the EMA copy adds every parameter
    and buffer once (a BN's running statistics too), frozen ones included."""
    model = nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(10))
    model[1].weight.requires_grad_(False)
    cfg = Config(dict(optim_wrapper=dict(optimizer=dict(type='AdamW'))))
    trained = (110 + 10) * 4  # float32 bytes: the linear layer and the BN's bias
    everything = (110 + 20) * 4 + (10 + 10) * 4 + 8  # parameters, running mean and var, num_batches_tracked
    assert extra_bytes(cfg, model, ema=False) == 3 * trained
    assert extra_bytes(cfg, model, ema=True) == 3 * trained + everything


def test_one_image_through_upernets_batch_norm_is_explained():
    """The one-process UperNet demo probed at 1 image per GPU: BN on the 1x1 pooled features cannot train,
    and the message says so and what would (not only torch's "Expected more than 1 value per channel")."""
    tiny = {'model.backbone.embed_dims': 64, 'model.backbone.depth': 4, 'model.backbone.num_heads': 4,
            'model.backbone.out_indices': (0, 1, 2, 3), 'model.decode_head.in_channels': [64] * 4,
            'model.auxiliary_head.in_channels': 64, 'auto_fit.probe_shape': (64, 64)}
    cfg = load_config(str(ROOT / 'configs/demo/upernet_xcit_tiny_12_p16_demo.py'), tiny)
    task_of_config(cfg).import_models()
    with pytest.raises(AutoFitError) as failure:
        fit(cfg, cfg.model, BatchPlan(1, 1, 2, reference_batch=16, base_lr=1e-4, scale_lr=False), amp=None)
    message = str(failure.value)
    assert 'at 1 images per GPU: ValueError: Expected more than 1 value per channel when training' in message
    for part in ('BN cannot train on one', 'model.backbone.with_cp=True', 'SyncBN', "type='GN'"):
        assert part in message, message
