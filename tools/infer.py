"""Run a trained detector or segmentor on your own images: CONFIG CHECKPOINT, or a published model alone
(a folder of tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one: xcit_dense/published.py).

For each image (a file, or every file of a folder) it writes a picture of the predictions
(boxes, masks and class names with scores, or a segmentation overlay) to OUT_DIR/<stem>.png
(<stem>_2.png, ... where names repeat; as tools/test.py --show-dir names them) and adds the raw
predictions to OUT_DIR/results.json (docs/datasets.md: boxes [x1, y1, x2, y2] in the image's
pixels, masks as COCO RLE). A file that is missing, not an image, damaged or over --max-pixels is
reported and skipped, a picture that cannot be drawn is reported (its predictions are kept); the
other images are still processed, results.json is written, and the exit status is 1 if any input
failed. Nothing is written through a link: one at a picture's name is reported as that picture's
failure, one at results.json's or the mosaic's name stops the tool.
"""
import argparse
import json
import os
import sys
from pathlib import Path
from typing import List

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import mmcv
import numpy as np
import torch.nn.functional as F
from mmengine.logging import MMLogger
from mmengine.structures import PixelData
from PIL import Image
from tqdm import tqdm

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.builder import load_config
from xcit_dense.datasets.files import check_image_file, decode_image
from xcit_dense.datasets.palette import complete_palette
from xcit_dense.datasets.problems import UNREADABLE_IMAGE, BadSample
from xcit_dense.inference import (
    DRAWN_OVERLAP_IOU,
    build_inferencer,
    default_device,
    drawing_sample,
    predict_image,
    prediction_record,
)
from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.hub import is_hub_name
from xcit_dense.io.output_files import write_bytes, writing
from xcit_dense.pictures import draw_picture, picture_name
from xcit_dense.pixel_limit import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS
from xcit_dense.published import is_published_model, open_published
from xcit_dense.tasks import Task, task_of_config
from xcit_dense.tool_errors import exit_status, stop_on
from xcit_launch.image_names import list_inputs
from xcit_launch.known_warnings import KnownLogMessages


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage='%(prog)s [options] (CONFIG CHECKPOINT | MODEL) INPUTS [INPUTS ...]')
    parser.add_argument('sources', nargs='+', metavar='CONFIG CHECKPOINT | MODEL, INPUTS',
                        help="the config the checkpoint was trained with and the checkpoint file (.pth, "
                             ".safetensors), https URL or hf-hub:OWNER/NAME (this toolkit's or the authors' released "
                             "models); or a published model alone (a folder of "
                             "tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one); then "
                             "image files and/or folders of images")
    parser.add_argument('--trust-config', action='store_true',
                        help="a published folder: build from its config.py (executed) instead of its recipe")
    parser.add_argument('--out-dir', default='work_dirs/infer', help='where pictures and results.json go')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections drawn from this score up (results.json keeps all)')
    parser.add_argument('--overlap-iou', type=float, default=DRAWN_OVERLAP_IOU,
                        help='of drawn boxes overlapping at a higher IoU, only the best scoring is drawn, '
                             'whatever its class (1: all drawn; results.json keeps all)')
    parser.add_argument('--raw-weights', action='store_true',
                        help='a checkpoint trained with --ema: predict with the trained weights, not their average')
    parser.add_argument('--limit', type=int, help='process at most this many images')
    parser.add_argument('--min-size', type=int, default=384,
                        help='pictures of smaller images are enlarged to this short side')
    parser.add_argument('--max-size', type=int, default=2048,
                        help='... but never beyond this long side (a 17x2000 strip stays a strip)')
    parser.add_argument('--max-pixels', type=int, default=DEFAULT_MAX_PIXELS,
                        help='images whose header declares more pixels are refused before decoding '
                             '(a few bytes can declare 40000x40000)')
    parser.add_argument('--max-bytes', type=int, default=DEFAULT_MAX_BYTES,
                        help='image files larger than this on disk are refused before they are opened')
    parser.add_argument('--device', help="where the model runs, e.g. cpu or cuda:1 (default: cuda:0 "
                                         "when torch sees a GPU, else cpu)")
    parser.add_argument('--mosaic', metavar='FILE',
                        help='also write the first pictures side by side into FILE (up to 4x4)')
    args = parser.parse_args()
    args.published = is_published_model(args.sources[0])
    if args.published:
        args.config, args.checkpoint, args.inputs = args.sources[0], None, args.sources[1:]
    else:
        args.config, args.checkpoint, args.inputs = args.sources[0], (args.sources[1:] or [None])[0], args.sources[2:]
        if args.trust_config:
            parser.error('--trust-config is for a published model folder')
    if not args.inputs:
        parser.error('no images given: CONFIG CHECKPOINT INPUTS, or MODEL INPUTS for a published model')
    return args


def read_image(path: str, max_pixels: int, max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """A BGR image decoded as the pipelines decode it (EXIF orientation ignored), its size on disk
    checked against ``max_bytes`` and its header against ``max_pixels`` first; FileNotFoundError or
    ValueError with the reason otherwise."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{path}: no such file')
    try:
        check_image_file(path, max_pixels=max_pixels, max_bytes=max_bytes)
        return decode_image(path)
    except BadSample as exc:
        if exc.kind == UNREADABLE_IMAGE:
            raise ValueError(f'{path}: not an image (cannot be decoded)') from None
        raise ValueError(f'{path}: {exc.kind}: {exc.detail}') from None
    except (OSError, MemoryError) as exc:
        raise ValueError(f'{path}: cannot be decoded: {type(exc).__name__}: {str(exc).strip()[:300]}') from None


def enlarge(image: np.ndarray, sample, task: Task, min_size: int, max_size: int):
    """The image and predictions scaled up (for drawing) so that the short side is ``min_size``, or
    less where the long side would pass ``max_size``."""
    scale = min(min_size / min(image.shape[:2]), max_size / max(image.shape[:2]))
    if scale <= 1:
        return image, sample
    size = (round(image.shape[0] * scale), round(image.shape[1] * scale))
    image = mmcv.imresize(image, size[::-1], interpolation='bilinear')
    sample = sample.clone()  # shallow: its fields are replaced below, never changed in place
    pred = getattr(sample, task.prediction)
    if isinstance(pred, PixelData):  # one size for all its fields: replace it, and drop the logits
        labels = F.interpolate(pred.data[None].float(), size=size)[0].long()
        setattr(sample, task.prediction, PixelData(data=labels))
        if 'seg_logits' in sample:
            del sample.seg_logits
    else:
        inst = pred.clone()
        inst.bboxes = inst.bboxes * scale
        if 'masks' in inst and len(inst):
            inst.masks = F.interpolate(inst.masks[None].float(), size=size)[0] > 0.5
        setattr(sample, task.prediction, inst)
    return image, sample


def write_mosaic(pictures: List[str], out_file: str, columns: int = 4) -> None:
    """Up to 16 pictures in a grid of ``columns`` columns, each fitted (aspect ratio kept, centred)
    into a cell of the first one's size."""
    tiles = [Image.open(p).convert('RGB') for p in pictures[:columns * columns]]
    width, height = tiles[0].size
    columns = min(columns, len(tiles))
    rows = -(-len(tiles) // columns)
    sheet = Image.new('RGB', (columns * width, rows * height), 'white')
    for i, tile in enumerate(tiles):
        scale = min(width / tile.width, height / tile.height)
        tile = tile.resize((max(1, round(tile.width * scale)), max(1, round(tile.height * scale))))
        sheet.paste(tile, ((i % columns) * width + (width - tile.width) // 2,
                           (i // columns) * height + (height - tile.height) // 2))
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    with writing(out_file) as path:  # a link at its name refused
        sheet.save(path)


def main() -> None:
    """The command line; ``exit_status`` turns the toolkit's errors into ``error: ...`` and their status."""
    args = parse_args()
    for path, what in ((args.config, 'config'), (args.checkpoint, 'checkpoint')) if not args.published else ():
        if '://' not in path and not is_hub_name(path) and not os.path.isfile(path):
            sys.exit(f'error: {what} file not found: {path}')
    MMLogger.get_current_instance().addFilter(KnownLogMessages())  # the stack's known notices
    out_dir = Path(args.out_dir)
    published = None
    with stop_on(ValueError, CheckpointError, RuntimeError):
        if args.published:
            published = open_published(args.config, args.trust_config)
            cfg, args.checkpoint = published.config, published.weights
        else:
            cfg = load_config(args.config)
        cfg.visualizer.save_dir = str(out_dir)  # its LocalVisBackend's folder (pictures go to out_file)
        task = task_of_config(cfg)
        inferencer = build_inferencer(cfg, args.checkpoint, device=args.device or default_device(),
                                      raw_weights=args.raw_weights)
    if published and published.dataset_meta:  # a safetensors file names no classes: model.json does
        inferencer.model.dataset_meta = dict(published.dataset_meta)
    if inferencer.weights_used:
        tqdm.write(inferencer.weights_used, file=sys.stderr)
    visualizer = inferencer.visualizer
    visualizer.alpha = 0.5
    meta = dict(inferencer.model.dataset_meta or {})
    classes = list(meta.get('classes') or ())
    palette = complete_palette(classes, meta.get('palette'))
    if palette:  # the checkpoint's, from a config whose palette was shorter than its classes
        tqdm.write(f'warning: {args.checkpoint} has {len(meta["palette"])} colours for {len(classes)} classes: '
                   f'the others are drawn in distinct colours', file=sys.stderr)
        meta['palette'] = palette
    visualizer.dataset_meta = meta  # mmseg's sets it only in its own visualize()
    draw_options = dict(pred_score_thr=args.score_thr) if task.draws_scores else {}
    out_dir.mkdir(parents=True, exist_ok=True)

    inputs = list(list_inputs(args.inputs))[:args.limit]
    results, pictures, used, failures = [], [], set(), 0
    for path in tqdm(inputs, desc='inference', unit='image'):
        try:
            image = read_image(path, args.max_pixels, args.max_bytes)
        except (FileNotFoundError, ValueError) as exc:
            tqdm.write(f'error: {exc}', file=sys.stderr)
            results.append(dict(image=path, error=str(exc)))
            failures += 1
            continue
        try:
            sample = predict_image(inferencer, image)
            shown, drawn = enlarge(mmcv.bgr2rgb(image), sample, task, args.min_size, args.max_size)
            drawn = drawing_sample(drawn, task, args.score_thr, args.overlap_iou)
        except (RuntimeError, ValueError, MemoryError) as exc:  # e.g. out of memory for a huge image
            message = (f'{path}: inference failed for this {image.shape[1]}x{image.shape[0]} image: '
                       f'{type(exc).__name__}: {(str(exc).splitlines() or [""])[0][:300]}')
            tqdm.write(f'error: {message}', file=sys.stderr)
            results.append(dict(image=path, error=message))
            failures += 1
            continue
        picture = str(out_dir / picture_name(path, used))
        not_drawn = draw_picture(visualizer, shown, drawn, picture, draw_gt=False, **draw_options)
        if not_drawn:  # its predictions are kept
            tqdm.write(f'error: {not_drawn}', file=sys.stderr)
            failures += 1
        else:
            pictures.append(picture)
        results.append(dict(image=path, height=image.shape[0], width=image.shape[1],
                            **(dict(error=not_drawn) if not_drawn else dict(picture=picture)),
                            **prediction_record(sample, task, classes)))
    summary = dict(config=args.config, checkpoint=args.checkpoint, task=task.name,
                   classes=classes, images=results)
    write_bytes(out_dir / 'results.json', json.dumps(summary).encode())  # a link at its name: UnsafeOutputError
    if args.mosaic and pictures:
        write_mosaic(pictures, args.mosaic)
    print(f'{len(pictures)} of {len(inputs)} images done: pictures and results.json in {out_dir}'
          + (f', mosaic {args.mosaic}' if args.mosaic and pictures else ''))
    if failures:
        sys.exit(f'{failures} input(s) failed: see the errors above')


if __name__ == '__main__':
    sys.exit(exit_status(main))
