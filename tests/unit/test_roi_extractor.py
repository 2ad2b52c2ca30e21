"""The Mask R-CNN configs' RoI extractor (KernelDtypeRoIExtractor) hands its RoIAlign layers
contiguous (NCHW) maps: compiled mmcv's kernel reads channels_last memory as NCHW, and the
backbone's maps are channels_last on a CPU. Planted: dropping the extractor's ``contiguous()``
fails the layout assertion here, whichever mmcv._ext is installed."""
import torch
from mmdet.registry import MODELS
from mmengine.registry import DefaultScope

import xcit_dense.models.kernel_dtypes  # noqa: F401  (registers the extractor)


def test_channels_last_maps_reach_roi_align_as_nchw_with_the_same_features():
    with DefaultScope.overwrite_default_scope('mmdet'):  # whatever scope an earlier test left current
        extractor = MODELS.build(dict(type='KernelDtypeRoIExtractor', out_channels=8, featmap_strides=[4, 8],
                                      roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0)))
    layouts = []
    for layer in extractor.roi_layers:
        layer.register_forward_pre_hook(lambda module, args: layouts.append(args[0].is_contiguous()))
    gen = torch.Generator().manual_seed(0)
    feats = (torch.randn(2, 8, 32, 40, generator=gen), torch.randn(2, 8, 16, 20, generator=gen))
    xy = torch.rand(20, 2, generator=gen) * 100
    image_index = torch.randint(0, 2, (20, 1), generator=gen).float()
    rois = torch.cat([image_index, xy, xy + 8 + 60 * torch.rand(20, 2, generator=gen)], 1)
    nchw = extractor(feats, rois)
    channels_last = extractor(tuple(f.to(memory_format=torch.channels_last) for f in feats), rois)
    assert layouts and all(layouts)
    torch.testing.assert_close(channels_last, nchw, rtol=0, atol=0)
