"""Image files capped by their size on disk before anything opens them, JPEGs by their scans and marker
segments and PNGs by their chunks (before the image data, and in all for their size) before a decoder
parses them, and label maps of more than 8 bits
refused where mmseg's 8-bit cast would change their values (docs/security.md)."""
import os
import time

import cv2
import numpy as np
import pytest
from bad_data import jpeg_after_comments, jpeg_of_repeated_scans, png_after_private_chunks, png_of_empty_data_chunks
from mmengine.config import Config
from PIL import Image

from xcit_dense.datasets import files
from xcit_dense.datasets.files import LABEL_MAP, check_image_file
from xcit_dense.datasets.problems import LABELS_OUTSIDE, TOO_MANY_BYTES, TOO_MUCH_WORK, BadSample
from xcit_dense.engine.planning.run_config import check_samples
from xcit_dense.pixel_limit import DEFAULT_MAX_BYTES
from xcit_launch.decode_work import MAX_PNG_HEADER_CHUNKS, MAX_SCANS, MAX_SEGMENTS, PNG_BYTES_PER_CHUNK

pytestmark = pytest.mark.quick


def test_a_sparse_gigabyte_behind_a_small_header_is_refused_before_it_is_opened(tmp_path, monkeypatch):
    """A 4x4 PNG's header, the file made 1 GiB (sparse): the pixel check passes, the size does not, and
    no decoder opens it (before: read whole)."""
    path = tmp_path / 'big.png'
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(path)
    os.truncate(path, 2 ** 30)
    opened = []
    monkeypatch.setattr(files.Image, 'open', lambda *args, **kwargs: opened.append(args))
    with pytest.raises(BadSample) as refused:
        check_image_file(str(path), decode=True)
    assert refused.value.kind == TOO_MANY_BYTES and refused.value.path == str(path), refused.value
    assert f'{2 ** 30} bytes on disk, over the limit of {DEFAULT_MAX_BYTES} (max_image_bytes)' in str(refused.value)
    assert opened == []


def test_a_jpeg_of_repeated_scans_is_refused_before_decoding(tmp_path):
    """tests/support/bad_data.py's progressive JPEG whose last scan repeats: each scan is a pass over the
    whole picture (before: decoded, hours for 8192x8192 within the byte limit); 100 scans pass, 101 do
    not, and a real progressive file of about 10 scans passes."""
    path = tmp_path / 'scans.jpg'
    jpeg_of_repeated_scans(path, MAX_SCANS)
    assert check_image_file(str(path)) == (64, 64)
    jpeg_of_repeated_scans(path, 2000)
    start = time.process_time()
    with pytest.raises(BadSample) as refused:
        check_image_file(str(path), decode=True)
    assert time.process_time() - start < 1
    assert (refused.value.kind, refused.value.detail) == (TOO_MUCH_WORK, f'a JPEG of more than {MAX_SCANS} scans')


def test_a_jpeg_behind_half_a_million_comments_is_refused_before_its_header_is_parsed(tmp_path):
    """2 MB of empty comment segments before a 64x64 JPEG: PIL parses them one by one in Python before it
    knows the size (before: 3 s here, 15 s and 1.1 GB for 64 MB); refused within a second of CPU."""
    path = tmp_path / 'comments.jpg'
    jpeg_after_comments(path, 2)
    start = time.process_time()
    with pytest.raises(BadSample) as refused:
        check_image_file(str(path))
    assert time.process_time() - start < 1
    assert (refused.value.kind, refused.value.detail) == (
        TOO_MUCH_WORK, f'a JPEG of more than {MAX_SEGMENTS} marker segments')


@pytest.mark.parametrize('write, megabytes, detail', [
    (png_after_private_chunks, 8, f'a PNG of more than {MAX_PNG_HEADER_CHUNKS} chunks before its image data'),
    (png_of_empty_data_chunks, 1,
     'a PNG of more than {limit} chunks (1024, and one for each 1024 of its {size} bytes)'),
], ids=['private_before_data', 'empty_data'])
def test_a_png_of_700000_private_or_90000_data_chunks_is_refused_before_it_is_parsed(tmp_path, write, megabytes,
                                                                                  detail):
    """8 MB of empty private chunks between a 64x64 PNG's header and its image data: PIL parses each when
    it opens the file (before: 7 to 24 s); 1 MB of empty image data chunks after its data: PIL reads each
    while decoding (before: passed, 0.7 s to decode, 14 s for 16 MB). Each refused within a second of
    CPU, reading only the first chunks; a 1024x1024 PNG of noise as libpng writes it (8 KiB chunks) passes."""
    path = tmp_path / 'chunks.png'
    write(path, megabytes)
    start = time.process_time()
    with pytest.raises(BadSample) as refused:
        check_image_file(str(path), LABEL_MAP)
    assert time.process_time() - start < 1
    size = path.stat().st_size
    assert (refused.value.kind, refused.value.detail) == (
        TOO_MUCH_WORK, detail.format(limit=MAX_PNG_HEADER_CHUNKS + size // PNG_BYTES_PER_CHUNK, size=size))
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 255, (1024, 1024, 3), np.uint8))
    assert check_image_file(str(path)) == (1024, 1024)


def test_the_config_key_reaches_the_samples_check():
    cfg = Config(dict(max_image_bytes=1000, train_dataloader=dict(dataset=dict(type='Anything')),
                      val_dataloader=dict(dataset=dict(type='StopOnBadSamples', dataset=dict(type='Anything')))))
    check_samples(cfg, ['train_dataloader', 'val_dataloader'])
    assert cfg.train_dataloader.dataset.max_image_bytes == 1000
    assert cfg.val_dataloader.dataset.max_image_bytes == 1000


def test_a_16_bit_label_map_with_a_value_of_300_is_refused_naming_it(tmp_path):
    """mmseg's loader casts label maps to 8 bits: 300 would become class 44 without a word."""
    labels = np.zeros((8, 8), np.uint16)
    labels[2, 3] = 300
    path = tmp_path / 'labels.png'
    Image.fromarray(labels).save(path)
    with pytest.raises(BadSample) as refused:
        check_image_file(str(path), LABEL_MAP)
    assert refused.value.kind == LABELS_OUTSIDE and refused.value.path == str(path)
    assert 'values reach 300' in refused.value.detail, refused.value
    labels[2, 3] = 255  # every value fits 8 bits: read as an 8-bit file would be
    Image.fromarray(labels).save(path)
    assert check_image_file(str(path), LABEL_MAP, decode=True) == (8, 8)
