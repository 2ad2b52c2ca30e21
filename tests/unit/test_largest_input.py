"""The largest image a training pipeline emits (datasets/largest_input.py), one test per transform it
understands: the bound read from the transform's config, checked against mmcv's, mmdet's or mmseg's
transform itself run on images of extreme shapes with its random draws at the top of their ranges, where
no output may exceed the bound and the largest must reach it (a formula too small or too large fails)."""
from typing import Iterable, Tuple

import numpy as np
import pytest
from mmcv.transforms import Pad, RandomChoice, RandomChoiceResize, RandomFlip, RandomResize, Resize
from mmdet.datasets.transforms import FixShapeResize, Pad as DetPad, RandomCrop as DetRandomCrop, Resize as DetResize
from mmseg.datasets.transforms import RandomCrop as SegRandomCrop

from xcit_dense.datasets.largest_input import Sides, largest_input

# (height, width) of input images: wide and tall beyond any scale below, both orientations of 1333 x 800
ANY_IMAGES = [(500, 2000), (2000, 500), (800, 1333), (1333, 800), (1000, 1000), (64, 48)]


@pytest.fixture
def draws_at_the_top(monkeypatch):
    """numpy's draws at the top of their ranges: the random transforms at their largest setting."""
    monkeypatch.setattr(np.random, 'randint', lambda low, high=None, size=None, dtype=int:
                        (low if high is None else high) - 1)
    monkeypatch.setattr(np.random, 'random_sample', lambda size=None: 1.0 if size is None else np.ones(size))
    monkeypatch.setattr(np.random, 'rand', lambda *shape: np.ones(shape) if shape else 1.0)


def config_and_transform(kind: type, **args) -> Tuple[dict, object]:
    """The config of a transform of class ``kind`` with ``args``, and the transform built from them."""
    return dict(type=kind.__name__, **args), kind(**args)


def emitted(transform, images: Iterable[Tuple[int, int]]) -> list:
    """The (long side, short side) of what ``transform`` makes of a blank image of each (height, width)."""
    out = []
    for h, w in images:
        results = transform(dict(img=np.zeros((h, w, 3), np.uint8), img_shape=(h, w), ori_shape=(h, w)))
        out.append(Sides(max(results['img'].shape[:2]), min(results['img'].shape[:2])))
    return out


def assert_reached_never_exceeded(bound: Sides, outputs: list) -> None:
    assert all(o.long <= bound.long and o.short <= bound.short for o in outputs), (bound, outputs)
    assert (max(o.long for o in outputs), max(o.short for o in outputs)) == bound, (bound, outputs)


@pytest.mark.parametrize('kind', [Resize, DetResize], ids=['mmcv', 'mmdet'])
def test_resize_keeping_the_ratio_bounds_by_the_scale_in_either_orientation(kind):
    cfg, transform = config_and_transform(kind, scale=(1333, 800), keep_ratio=True)
    bound = largest_input([cfg])
    assert bound == (1333, 800)
    assert_reached_never_exceeded(bound, emitted(transform, ANY_IMAGES))


def test_resize_to_a_fixed_scale_emits_the_scale():
    cfg, transform = config_and_transform(Resize, scale=(1333, 800), keep_ratio=False)
    assert largest_input([cfg]) == (1333, 800)
    assert set(emitted(transform, ANY_IMAGES)) == {(1333, 800)}


def test_resize_by_a_factor_scales_the_bound_it_takes_rounding_as_mmcv():
    cfg, transform = config_and_transform(Resize, scale_factor=1.5, keep_ratio=True)
    assert largest_input([cfg]) is None  # images of any size stay unbounded
    bound = largest_input([cfg], taken=Sides(101, 51))
    assert bound == (152, 77)  # 151.5 and 76.5 rounded up (Python's round() gives 76)
    assert_reached_never_exceeded(bound, emitted(transform, [(51, 101), (101, 51), (40, 40)]))


def test_random_resize_by_a_ratio_reaches_the_top_ratio(draws_at_the_top):
    cfg, transform = config_and_transform(RandomResize, scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True)
    bound = largest_input([cfg])
    assert bound == (4096, 1024)
    assert_reached_never_exceeded(bound, emitted(transform, ANY_IMAGES))


def test_random_resize_between_two_scales_draws_each_edge_up_to_its_top(draws_at_the_top):
    """Edges drawn between (500, 900) and between (1100, 700): up to 900 x 1100, a short side of 900,
    more than either scale's short side."""
    cfg, transform = config_and_transform(RandomResize, scale=[(500, 1100), (900, 700)], keep_ratio=True)
    bound = largest_input([cfg])
    assert bound == (1100, 900)
    assert_reached_never_exceeded(bound, emitted(transform, ANY_IMAGES))


def test_random_choice_resize_covers_every_scale():
    scales = [(1333, 640), (1333, 800), (1000, 900)]
    cfg = dict(type='RandomChoiceResize', scales=scales, keep_ratio=True)
    bound = largest_input([cfg])
    assert bound == (1333, 900)
    outputs = [o for scale in scales for o in emitted(RandomChoiceResize(scales=[scale], keep_ratio=True),
                                                        ANY_IMAGES)]
    assert_reached_never_exceeded(bound, outputs)


def test_random_choice_covers_every_branch():
    branches = [[dict(type='Resize', scale=(1000, 600), keep_ratio=True)],
                [dict(type='Resize', scale=(1100, 700), keep_ratio=False),
                 dict(type='RandomCrop', crop_size=(640, 640))]]
    bound = largest_input([dict(type='RandomChoice', transforms=branches)])
    assert bound == (1000, 640)
    outputs = []
    for one_hot in ([1.0, 0.0], [0.0, 1.0]):
        transform = RandomChoice(transforms=[[Resize(scale=(1000, 600), keep_ratio=True)],
                                             [Resize(scale=(1100, 700), keep_ratio=False),
                                              DetRandomCrop(crop_size=(640, 640))]], prob=one_hot)
        outputs += emitted(transform, ANY_IMAGES)
    assert_reached_never_exceeded(bound, outputs)


def test_mmdet_random_crop_of_absolute_width_and_height():
    cfg, transform = config_and_transform(DetRandomCrop, crop_size=(600, 384))
    bound = largest_input([cfg])
    assert bound == (600, 384)
    assert_reached_never_exceeded(bound, emitted(transform, ANY_IMAGES))
    assert largest_input([cfg], taken=Sides(500, 300)) == (500, 300)  # never larger than its input


def test_mmdet_random_crop_of_an_absolute_range_draws_both_sides_up_to_the_top(draws_at_the_top):
    cfg, transform = config_and_transform(DetRandomCrop, crop_size=(384, 600), crop_type='absolute_range')
    bound = largest_input([cfg])
    assert bound == (600, 600)
    assert_reached_never_exceeded(bound, emitted(transform, ANY_IMAGES))


def test_mmdet_random_crop_relative_to_its_input(draws_at_the_top):
    cfg, transform = config_and_transform(DetRandomCrop, crop_size=(0.5, 0.8), crop_type='relative')
    assert largest_input([cfg]) is None
    bound = largest_input([cfg], taken=Sides(1000, 500))
    assert bound == (800, 400)
    assert_reached_never_exceeded(bound, emitted(transform, [(1000, 500), (500, 1000), (500, 500)]))
    cfg, transform = config_and_transform(DetRandomCrop, crop_size=(0.3, 0.7), crop_type='relative_range')
    bound = largest_input([cfg], taken=Sides(1000, 500))
    assert bound == (1000, 500)  # the range reaches 1
    assert_reached_never_exceeded(bound, emitted(transform, [(1000, 500), (500, 1000)]))


def test_mmseg_random_crop_of_height_and_width():
    cfg, transform = config_and_transform(SegRandomCrop, crop_size=(512, 1024))
    bound = largest_input([cfg])
    assert bound == (1024, 512)
    assert_reached_never_exceeded(bound, emitted(transform, ANY_IMAGES))


@pytest.mark.parametrize('keep_ratio', [False, True])
def test_fix_shape_resize_emits_its_shape_whatever_it_takes(keep_ratio):
    cfg, transform = config_and_transform(FixShapeResize, width=640, height=480, keep_ratio=keep_ratio)
    assert largest_input([cfg]) == largest_input([cfg], taken=Sides(100, 50)) == (640, 480)
    assert set(emitted(transform, ANY_IMAGES)) == {(640, 480)}


@pytest.mark.parametrize('kind', [Pad, DetPad], ids=['mmcv', 'mmdet'])
def test_pad_to_a_size_leaves_larger_sides_alone(kind):
    cfg, transform = config_and_transform(kind, size=(600, 500))  # (width, height)
    assert largest_input([cfg]) == (600, 500)
    bound = largest_input([cfg], taken=Sides(700, 100))
    assert bound == (700, 500)
    assert_reached_never_exceeded(bound, emitted(transform, [(100, 700), (100, 100)]))


@pytest.mark.parametrize('kind', [Pad, DetPad], ids=['mmcv', 'mmdet'])
def test_pad_to_a_multiple_and_to_a_square(kind):
    cfg, transform = config_and_transform(kind, size_divisor=32)
    assert largest_input([cfg]) is None
    bound = largest_input([cfg], taken=Sides(100, 50))
    assert bound == (128, 64)
    assert_reached_never_exceeded(bound, emitted(transform, [(100, 50), (50, 100), (33, 33)]))
    cfg, transform = config_and_transform(kind, size_divisor=32, pad_to_square=True)
    bound = largest_input([cfg], taken=Sides(100, 50))
    assert bound == (128, 128)
    assert_reached_never_exceeded(bound, emitted(transform, [(100, 50), (50, 100), (33, 33)]))


def test_other_transforms_keep_the_bound_and_nothing_sized_leaves_it_unknown():
    cfg, transform = config_and_transform(RandomFlip, prob=1.0, direction='vertical')
    assert largest_input([dict(type='LoadImageFromFile'), cfg]) is None
    bound = largest_input([cfg], taken=Sides(1333, 800))
    assert bound == (1333, 800)
    assert_reached_never_exceeded(bound, emitted(transform, [(800, 1333), (1333, 800)]))
