"""xcit_launch/onnx_segmentation.py's numpy parts against the libraries it stands in for (pycocotools'
RLE, mmcv's resize rule), which tools/deployment/infer_onnx.py cannot import."""
import mmcv
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from xcit_launch.onnx_segmentation import encode_mask, rescaled_size


@pytest.mark.quick
def test_masks_encode_as_pycocotools_encodes_them():
    """Empty, full, starting with ones, one pixel, and random masks with long runs (counts over 31 and
    differences below zero take several characters)."""
    rng = np.random.default_rng(0)
    masks = [np.zeros((5, 7), bool), np.ones((5, 7), bool), np.eye(6, dtype=bool), np.zeros((1, 1), bool),
             np.ones((1, 1), bool), rng.random((40, 90)) < 0.5, rng.random((300, 200)) < 0.001,
             np.add.outer(np.arange(120), np.arange(80)) % 97 < 60]
    for mask in masks:
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        assert encode_mask(mask) == dict(size=list(rle['size']), counts=rle['counts'].decode('ascii'))


@pytest.mark.quick
def test_resize_rule_is_mmcvs():
    for height, width in ((64, 64), (375, 500), (500, 375), (17, 2000), (2000, 17), (513, 1023)):
        for scale in ((2048, 512), (128, 128), (1333, 800)):
            expected = mmcv.rescale_size((width, height), scale)[::-1]
            assert rescaled_size(height, width, scale, keep_ratio=True) == expected
        assert rescaled_size(height, width, (640, 480), keep_ratio=False) == (480, 640)
