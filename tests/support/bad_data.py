"""Bad data as an attacker or a damaged copy would hand it over, written for the tests: a COCO set
holding every bad-data variant, and files whose headers declare gigabytes in a few bytes."""
import json
import struct
import zlib
from pathlib import Path
from typing import Dict

import numpy as np
from helpers import ROOT
from PIL import Image

BOMB_SIDE = 262144  # 262144^2 pixels: 64 GiB as one mask plane, 192 GiB as an RGB image


def png_header(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header declares ``width`` x ``height`` RGB pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
    header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(b'')) + chunk(b'IEND', b'')


def jpeg_declaring(path: Path, width: int, height: int) -> None:
    """A small real JPEG whose frame header (SOF0) is rewritten to declare ``width`` x ``height``."""
    Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(path, quality=90)
    data = bytearray(path.read_bytes())
    sof = data.index(b'\xff\xc0')
    data[sof + 5:sof + 9] = struct.pack('>HH', height, width)
    path.write_bytes(bytes(data))


def rle_bomb() -> dict:
    """A 20-byte compressed RLE mask that declares BOMB_SIDE x BOMB_SIDE pixels."""
    return dict(size=[BOMB_SIDE, BOMB_SIDE], counts='0' * 12)


def good_box(ann_id: int, image_id: int) -> dict:
    return dict(id=ann_id, image_id=image_id, category_id=1, bbox=[8, 8, 30, 30], area=900, iscrowd=0,
                segmentation=[[8, 8, 38, 8, 38, 38, 8, 38]])


# the kinds the set holds, with how many of each a reader must find
SAMPLE_KINDS = {'unreadable images': 2, 'images over the pixel limit': 1, 'paths leaving data_root': 2}
ANNOTATION_KINDS = {'boxes of zero or negative size': 1, 'boxes with NaN or infinite values': 2,
                    'boxes that are not four numbers': 1, 'polygons with fewer than three points': 1,
                    'bad RLE masks': 1}


def write_bad_coco(root: Path) -> Dict[str, Path]:
    """``root/img/*`` and ``root/ann.json`` (one class, 64x64 images): two good images, the first with
    every bad annotation besides its good one, then one image of each bad-sample kind (each with a good
    box, so that training does not filter it out). Returns the files by name."""
    (root / 'img').mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = {}
    for name in ('good_0.jpg', 'good_1.jpg'):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), np.uint8)).save(root / 'img' / name)
    (root / 'img' / 'garbage.jpg').write_bytes(b'\xff\xd8 this is not a JPEG')
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), np.uint8)).save(root / 'img' / 'whole.png')
    whole = (root / 'img' / 'whole.png').read_bytes()
    (root / 'img' / 'truncated.png').write_bytes(whole[:len(whole) // 2])
    (root / 'img' / 'whole.png').unlink()
    (root / 'img' / 'bomb.png').write_bytes(png_header(BOMB_SIDE, BOMB_SIDE))
    files['outside'] = root.parent / 'outside.jpg'  # a readable image, but not the dataset's
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), np.uint8)).save(files['outside'])
    names = ['good_0.jpg', 'good_1.jpg', 'garbage.jpg', 'truncated.png', 'bomb.png', '../outside.jpg',
             str(files['outside'])]
    images = [dict(id=i + 1, file_name=name, width=64, height=64) for i, name in enumerate(names)]
    anns = [good_box(i + 1, i + 1) for i in range(len(names))]
    bad = [dict(bbox=[10, 10, 8, -3]), dict(bbox=[10, 10, float('nan'), 5]), dict(bbox=[1, 1, float('inf'), 5]),
           dict(bbox='abcd'), dict(segmentation=[[30, 30]]), dict(segmentation=rle_bomb())]
    for k, fields in enumerate(bad):
        anns.append(dict(good_box(100 + k, 1), **fields))
    (root / 'ann.json').write_text(json.dumps(dict(images=images, annotations=anns,
                                                   categories=[dict(id=1, name='box')])))
    files.update({name: root / 'img' / name for name in names[:5]})
    return files


def hdr_header(width: int, height: int) -> bytes:
    """A Radiance HDR file (a format PIL does not read, OpenCV does) of a header declaring
    ``width`` x ``height`` pixels, and a few bytes of pixels."""
    return f'#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y {height} +X {width}\n'.encode() + bytes(64)


# 12000^2 pixels: over the toolkit's limit (2^27), under OpenCV's own default (2^30), 1.6 GiB decoded
HDR_SIDE = 12000
# a triangle of 4e8 pixels' extent on a 64x64 image: pycocotools would ask for about 48 GB to rasterise it
POLYGON_BOMB = [0, 0, 4e8, 0, 4e8, 4e8]


def write_bomb_coco(root: Path) -> None:
    """``root/img/{good.jpg,bomb.png,bomb.hdr,poly.jpg}`` and ``root/ann.json``: a good image whose second
    annotation is the RLE bomb, an image whose PNG header is the 192 GiB bomb, an HDR image over the
    pixel limit, and a good image whose second annotation is the polygon bomb (each with a good box too)."""
    (root / 'img').mkdir(parents=True)
    for name in ('good.jpg', 'poly.jpg'):
        Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(root / 'img' / name)
    (root / 'img' / 'bomb.png').write_bytes(png_header(BOMB_SIDE, BOMB_SIDE))
    (root / 'img' / 'bomb.hdr').write_bytes(hdr_header(HDR_SIDE, HDR_SIDE))
    images = [dict(id=i + 1, file_name=name, width=64, height=64)
              for i, name in enumerate(('good.jpg', 'bomb.png', 'bomb.hdr', 'poly.jpg'))]
    anns = [good_box(1, 1), dict(good_box(2, 1), segmentation=rle_bomb()), good_box(3, 2), good_box(4, 3),
            good_box(5, 4), dict(good_box(6, 4), segmentation=[POLYGON_BOMB])]
    (root / 'ann.json').write_text(json.dumps(dict(images=images, annotations=anns,
                                                   categories=[dict(id=1, name='box')])))


def tiny_det_config(tmp_path: Path, root: Path) -> Path:
    """The demo Mask R-CNN, shrunk for a CPU test, on the set of ``write_bad_coco``: one iteration
    over all 7 images in order, then a validation on the same set."""
    dataset = dict(data_root=str(root), ann_file='ann.json', data_prefix=dict(img='img/'),
                   metainfo=dict(classes=('box',)))
    config = tmp_path / 'bad_det.py'
    config.write_text(
        f"_base_ = [{str(ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py')!r}]\n"
        "model = dict(backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)),\n"
        "             neck=dict(in_channels=[64] * 4),\n"
        "             roi_head=dict(bbox_head=dict(num_classes=1), mask_head=dict(num_classes=1)))\n"
        f"train_dataloader = dict(batch_size=7, num_workers=0, persistent_workers=False, batch_sampler=None,\n"
        f"    sampler=dict(type='InfiniteSampler', shuffle=False), dataset=dict({dataset!r}))\n"
        f"val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False, dataset=dict({dataset!r}))\n"
        "test_dataloader = val_dataloader\n"
        f"val_evaluator = dict(ann_file={str(root / 'ann.json')!r}, metric=['bbox'])\n"
        "test_evaluator = val_evaluator\n"
        "train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=1, val_interval=1)\n"
        "param_scheduler = []\n"
        "log_processor = dict(by_epoch=False)\n"
        "default_hooks = dict(checkpoint=dict(interval=1, by_epoch=False), logger=dict(interval=1))\n")
    return config


# issue 63's annotation attacks: work and log out of proportion to the file, and tracebacks
HUGE_INT = 10 ** 400  # JSON reads it exactly; no float holds it (float() raises OverflowError)
LONG_FILE_NAME = 'n' * 10_000 + '.jpg'  # repeated in each dropped annotation's warning before


def rle_one_long_number(characters: int, height: int = 64, width: int = 64) -> dict:
    """An RLE whose counts string is one number of ``characters`` characters: decoded 5 bits a
    character into one ever larger integer, it cost time quadratic in its length."""
    return dict(size=[height, width], counts='o' * (characters - 1) + '0')


def striped_rle(height: int = 1024, width: int = 1024) -> dict:
    """A real RLE (pycocotools' own encoding) of alternate rows set: in its column-major order every run
    is one pixel long, ``height`` x ``width`` runs, a counts string of as many characters (1 MB)."""
    from pycocotools import mask as mask_utils
    mask = np.zeros((height, width), np.uint8, order='F')
    mask[::2] = 1
    rle = mask_utils.encode(mask)
    return dict(size=[height, width], counts=rle['counts'].decode())


def write_annotation_attacks(root: Path, copies: int) -> Path:
    """``root/ann.json`` (no images are needed to read it): one 64x64 image named LONG_FILE_NAME with a
    good box and ``copies`` times three bad annotations (a box and a polygon holding HUGE_INT, an RLE of
    one 20-character number); returns the file."""
    root.mkdir(parents=True, exist_ok=True)
    anns = [good_box(1, 1)]
    for k in range(copies):
        anns += [dict(good_box(10 + 3 * k, 1), bbox=[8, 8, HUGE_INT, 30]),
                 dict(good_box(11 + 3 * k, 1), segmentation=[[8, 8, HUGE_INT, 8, 38, 38]]),
                 dict(good_box(12 + 3 * k, 1), segmentation=rle_one_long_number(20))]
    path = root / 'ann.json'
    path.write_text(json.dumps(dict(images=[dict(id=1, file_name=LONG_FILE_NAME, width=64, height=64)],
                                    annotations=anns, categories=[dict(id=1, name='box')])))
    return path


def jpeg_of_repeated_scans(path: Path, scans: int, side: int = 64) -> None:
    """A progressive JPEG of ``side`` x ``side`` noise whose last scan is repeated until it holds
    ``scans`` scans: every decoder passes over the whole picture once a scan."""
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (side, side, 3), np.uint8)).save(
        path, progressive=True, quality=90)
    data = path.read_bytes()
    last = data.rindex(b'\xff\xda')
    extra = scans - data.count(b'\xff\xda')
    path.write_bytes(data[:last] + data[last:-2] * (extra + 1) + data[-2:])


def jpeg_after_comments(path: Path, megabytes: int) -> None:
    """A 64x64 JPEG behind ``megabytes`` MB of empty comment segments (4 bytes each): PIL parses them
    one by one before the image's size is known."""
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[:2] + b'\xff\xfe\x00\x02' * (megabytes * 2 ** 18) + data[2:])


def png_after_private_chunks(path: Path, megabytes: int) -> None:
    """A 64x64 PNG with ``megabytes`` MB of empty private chunks (12 bytes each) between its header
    and its image data: PIL parses them one by one when it opens the file."""
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(path)
    data = path.read_bytes()
    first_data = data.index(b'IDAT') - 4
    empty = struct.pack('>I', 0) + b'prVt' + struct.pack('>I', zlib.crc32(b'prVt'))
    path.write_bytes(data[:first_data] + empty * (megabytes * 2 ** 20 // 12) + data[first_data:])


def png_of_empty_data_chunks(path: Path, megabytes: int) -> None:
    """A 64x64 PNG whose image data is followed by ``megabytes`` MB of empty image data chunks (12 bytes
    each): PIL reads each one in Python while decoding."""
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(path)
    data = path.read_bytes()
    end = data.index(b'IEND') - 4
    empty = struct.pack('>I', 0) + b'IDAT' + struct.pack('>I', zlib.crc32(b'IDAT'))
    path.write_bytes(data[:end] + empty * (megabytes * 2 ** 20 // 12) + data[end:])
