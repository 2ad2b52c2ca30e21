"""The annotation checks of xcit_dense/datasets/annotations.py against issue 63's attacks
(tests/support/bad_data.py): RLE strings decoded in linear time, each number bounded in characters,
and JSON integers beyond float range found bad instead of raising."""
import time

import numpy as np
import pytest
from bad_data import HUGE_INT, rle_one_long_number, striped_rle
from pycocotools import mask as mask_utils

from xcit_dense.datasets.annotations import (
    RLE_NUMBER_CHARACTERS,
    box_problem,
    image_size_problem,
    polygon_problem,
    rle_problem,
)
from xcit_dense.datasets.problems import BAD_RLE, BOX_NOT_FINITE, POLYGON_NOT_NUMBERS

pytestmark = pytest.mark.quick


def test_rle_counts_are_decoded_in_linear_time_each_number_bounded():
    """One number of 300,000 characters is refused by its length (before: decoded into one integer of
    1.5 million bits, 5 s of CPU, quadratic); pycocotools' own 1 MB string of a million runs is accepted
    within a second of CPU (before: 2 s), and one with a run more is not."""
    long_number, mask = rle_one_long_number(300_000), striped_rle()
    start = time.process_time()
    assert rle_problem(long_number, 64, 64) == (
        BAD_RLE, f'RLE counts that do not decode: a number of 300000 characters, more than {RLE_NUMBER_CHARACTERS}')
    assert rle_problem(mask, 1024, 1024) is None
    assert time.process_time() - start < 1
    assert mask_utils.decode(mask).sum() == 512 * 1024  # the string is pycocotools' own
    assert rle_problem(dict(mask, counts=mask['counts'] + '1'), 1024, 1024) == (
        BAD_RLE, 'RLE counts that do not cover its 1024x1024 pixels')


@pytest.mark.parametrize('height, width', [(1, 1), (7, 5), (64, 48)])
def test_rle_strings_decode_to_pycocotools_runs(height, width):
    """Random masks, first pixel set or not: the strings pycocotools writes are accepted, and one cut
    short is not."""
    rng = np.random.default_rng(height)
    for density in (0.0, 0.05, 0.5, 0.95, 1.0):
        mask = np.asfortranarray(rng.random((height, width)) < density).astype(np.uint8)
        counts = mask_utils.encode(np.asfortranarray(mask))['counts'].decode()
        assert rle_problem(dict(size=[height, width], counts=counts), height, width) is None
        assert rle_problem(dict(size=[height, width], counts=counts[:-1]), height, width) is not None


def test_integers_beyond_float_range_are_bad_numbers_not_an_overflow():
    """A 400-digit integer in a box or polygon (before: OverflowError from math.isfinite), or as an
    image's width (before: OverflowError from the polygon check's margin); the detail quotes the
    value in at most 80 characters."""
    kind, detail = box_problem(dict(bbox=[8, 8, HUGE_INT, 30], area=900), 64, 64)
    assert kind == BOX_NOT_FINITE and detail.startswith('box [8, 8, 1000') and len(detail) <= 84, detail
    kind, detail = polygon_problem([8, 8, HUGE_INT, 8, 38, 38], 64, 64)
    assert kind == POLYGON_NOT_NUMBERS and len(detail) <= 90, detail
    problem = image_size_problem(dict(id=3, file_name='c.jpg', height=64, width=HUGE_INT))
    assert problem.startswith('image c.jpg (id 3) has width 1000') and len(problem) <= 150, problem
    assert image_size_problem(dict(id=3, file_name='c.jpg', height=64, width=48)) is None
