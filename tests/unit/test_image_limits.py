"""Image files capped by their size on disk before anything opens them, and label maps of more than 8 bits
refused where mmseg's 8-bit cast would change their values (docs/security.md)."""
import os

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from xcit_dense.datasets import files
from xcit_dense.datasets.files import LABEL_MAP, check_image_file
from xcit_dense.datasets.problems import LABELS_OUTSIDE, TOO_MANY_BYTES, BadSample
from xcit_dense.engine.run_config import check_samples
from xcit_dense.pixel_limit import DEFAULT_MAX_BYTES

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
