"""Run a trained detector or segmentor on your own images.

For each image (a file, or every file of a folder) it writes a picture of the predictions
(boxes, masks and class names with scores, or a segmentation overlay) to OUT_DIR/<name>.png and
adds the raw predictions to OUT_DIR/results.json (boxes in pixels, masks as COCO RLE). A file
that is missing or not an image is reported and skipped; the other images are still processed,
and the exit status is 1 if any input failed.
"""
import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import mmcv
import numpy as np
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from PIL import Image
from pycocotools import mask as mask_utils
from torch import nn
from tqdm import tqdm

from xcit_dense.builder import build_model, load_config
from xcit_dense.engine.checkpoints import allow_mmengine_checkpoints, check_matches_model
from xcit_dense.models.checkpoint import CheckpointError, read_checkpoint

TASKS = dict(mmdet='detection', mmseg='segmentation')
# state-dict prefixes that only one task's models have
TASK_KEYS = dict(detection=('rpn_head.', 'roi_head.'), segmentation=('decode_head.',))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='checkpoint file (.pth)')
    parser.add_argument('inputs', nargs='+', help='image files and/or folders of images')
    parser.add_argument('--out-dir', default='work_dirs/infer', help='where pictures and results.json go')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections drawn from this score up (results.json keeps all)')
    parser.add_argument('--limit', type=int, help='process at most this many images')
    parser.add_argument('--min-size', type=int, default=384,
                        help='pictures of smaller images are enlarged to this short side')
    parser.add_argument('--mosaic', metavar='FILE',
                        help='also write the first pictures side by side into FILE (up to 4x4)')
    return parser.parse_args()


def checkpoint_task(state: dict) -> Optional[str]:
    """'detection' or 'segmentation' from a state dict's keys; None when neither shows."""
    for task, prefixes in TASK_KEYS.items():
        if any(key.startswith(prefixes) for key in state):
            return task
    return None


def load_model(cfg: Config, config: str, checkpoint: str) -> Tuple[nn.Module, str, dict]:
    """The model of ``cfg`` (read from ``config``) with the weights of ``checkpoint``, its
    default scope and dataset meta (class names, palette).

    Raises ``CheckpointError`` for a checkpoint of the other task or of another model.
    """
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        raise ValueError(f"config {config} needs default_scope 'mmdet' or 'mmseg', got {scope!r}")
    allow_mmengine_checkpoints()
    ckpt = read_checkpoint(checkpoint)
    state = ckpt.get('state_dict')
    if not isinstance(state, dict):
        raise CheckpointError(f'{checkpoint} is not a training checkpoint (no state_dict)')
    task, found = TASKS[scope], checkpoint_task(state)
    if found and found != task:
        raise CheckpointError(f'{checkpoint} holds a {found} model but {config} builds a {task} '
                              f'model: pass the config it was trained with')
    cfg.model.backbone.init_cfg = None  # every weight comes from the checkpoint
    model = build_model(cfg, init=False)
    check_matches_model(model, checkpoint)
    model.load_state_dict(state)
    meta = (ckpt.get('meta') or {}).get('dataset_meta') or {}
    if not meta.get('classes'):
        metainfo = cfg.test_dataloader.dataset.get('metainfo') or {}
        meta = dict(metainfo) if metainfo.get('classes') else {}
    return model.eval(), scope, meta


def build_pipeline(cfg_pipeline: list, scope: str):
    """The config's test pipeline for an image already in memory, without annotation loading."""
    importlib.import_module(f'{scope}.datasets')
    registry = importlib.import_module(f'{scope}.registry').TRANSFORMS
    steps = [dict(step) for step in cfg_pipeline if 'LoadAnnotations' not in step['type']]
    steps[0] = dict(type='LoadImageFromNDArray')
    with DefaultScope.overwrite_default_scope(scope):
        transforms = [registry.build(step) for step in steps]

    def run(image: np.ndarray) -> dict:
        data = dict(img=image, img_id=0, img_path=None)
        for transform in transforms:
            data = transform(data)
        return data
    return run


def list_inputs(inputs: List[str]) -> Iterator[str]:
    """Files as given; the files of a folder in name order (hidden ones skipped)."""
    for item in inputs:
        if os.path.isdir(item):
            yield from sorted(str(p) for p in Path(item).iterdir() if p.is_file()
                              and not p.name.startswith('.'))
        else:
            yield item


def read_image(path: str) -> np.ndarray:
    """A BGR image; FileNotFoundError or ValueError with the reason otherwise."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{path}: no such file')
    image = mmcv.imread(path)  # None when the bytes do not decode as an image
    if image is None:
        raise ValueError(f'{path}: not an image (cannot be decoded)')
    return image


def encode_mask(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return dict(size=list(rle['size']), counts=rle['counts'].decode('ascii'))


def raw_results(sample, scope: str, classes: List[str]) -> dict:
    """The predictions of one data sample as JSON-ready lists."""
    def name(label: int) -> str:
        return classes[label] if label < len(classes) else str(label)
    if scope == 'mmdet':
        inst = sample.pred_instances.cpu()
        masks = inst.masks.numpy() if 'masks' in inst else [None] * len(inst)
        return dict(instances=[
            dict(label=int(label), **{'class': name(int(label))}, score=round(float(score), 4),
                 bbox=[round(float(v), 2) for v in bbox],
                 **(dict(mask=encode_mask(mask)) if mask is not None else {}))
            for label, score, bbox, mask in zip(inst.labels, inst.scores, inst.bboxes, masks)])
    labels = sample.pred_sem_seg.data[0].cpu().numpy()
    return dict(segments=[
        dict(label=int(label), **{'class': name(int(label))}, area=int((labels == label).sum()),
             mask=encode_mask(labels == label))
        for label in np.unique(labels)])


def enlarge(image: np.ndarray, sample, scope: str, min_size: int):
    """The image and predictions scaled up so that the short side is ``min_size`` (for drawing)."""
    scale = min_size / min(image.shape[:2])
    if scale <= 1:
        return image, sample
    size = (round(image.shape[0] * scale), round(image.shape[1] * scale))
    image = mmcv.imresize(image, size[::-1], interpolation='bilinear')
    sample = sample.clone()  # shallow: its fields are replaced below, never changed in place
    if scope == 'mmdet':
        inst = sample.pred_instances = sample.pred_instances.clone()
        inst.bboxes = inst.bboxes * scale
        if 'masks' in inst and len(inst):
            inst.masks = F.interpolate(inst.masks[None].float(), size=size)[0] > 0.5
    else:  # a PixelData keeps one size for all its fields: replace it, and drop the logits
        labels = F.interpolate(sample.pred_sem_seg.data[None].float(), size=size)[0].long()
        sample.pred_sem_seg = PixelData(data=labels)
        if 'seg_logits' in sample:
            del sample.seg_logits
    return image, sample


def build_visualizer(scope: str, meta: dict):
    """mmdet's or mmseg's local visualizer, with the class names and colours of ``meta``."""
    module = importlib.import_module(f'{scope}.visualization')
    cls = module.DetLocalVisualizer if scope == 'mmdet' else module.SegLocalVisualizer
    visualizer = cls(name=f'infer_{scope}', alpha=0.5)
    visualizer.dataset_meta = meta
    return visualizer


def draw(visualizer, scope: str, image_rgb: np.ndarray, sample, out_file: str, score_thr: float) -> None:
    if scope == 'mmdet':
        visualizer.add_datasample('pred', image_rgb, sample, draw_gt=False, out_file=out_file,
                                  pred_score_thr=score_thr)
    else:
        visualizer.add_datasample('pred', image_rgb, sample, draw_gt=False, out_file=out_file)


def write_mosaic(pictures: List[str], out_file: str, columns: int = 4) -> None:
    """Up to 16 pictures in a grid of ``columns`` columns, each scaled to the first one's size."""
    tiles = [Image.open(p).convert('RGB') for p in pictures[:columns * columns]]
    width, height = tiles[0].size
    columns = min(columns, len(tiles))
    rows = -(-len(tiles) // columns)
    sheet = Image.new('RGB', (columns * width, rows * height), 'white')
    for i, tile in enumerate(tiles):
        sheet.paste(tile.resize((width, height)), ((i % columns) * width, (i // columns) * height))
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out_file)


def main() -> None:
    args = parse_args()
    for path, what in ((args.config, 'config'), (args.checkpoint, 'checkpoint')):
        if not os.path.isfile(path):
            sys.exit(f'error: {what} file not found: {path}')
    try:
        cfg = load_config(args.config)
        model, scope, meta = load_model(cfg, args.config, args.checkpoint)
    except (ValueError, CheckpointError) as exc:
        sys.exit(f'error: {exc}')
    pipeline = build_pipeline(cfg.test_dataloader.dataset.pipeline, scope)
    visualizer = build_visualizer(scope, meta)
    classes = list(meta.get('classes', ()))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    inputs = list(list_inputs(args.inputs))[:args.limit]
    results, pictures, used, failures = [], [], set(), 0
    for path in tqdm(inputs, desc='inference', unit='image'):
        try:
            image = read_image(path)
        except (FileNotFoundError, ValueError) as exc:
            tqdm.write(f'error: {exc}', file=sys.stderr)
            results.append(dict(image=path, error=str(exc)))
            failures += 1
            continue
        stem = Path(path).stem
        picture = str(out_dir / (f'{stem}.png' if f'{stem}.png' not in used else f'{stem}_{len(used)}.png'))
        try:
            with torch.no_grad(), DefaultScope.overwrite_default_scope(scope):
                sample = model.test_step(pseudo_collate([pipeline(image)]))[0]
            shown, drawn = enlarge(mmcv.bgr2rgb(image), sample, scope, args.min_size)
            draw(visualizer, scope, shown, drawn, picture, args.score_thr)
        except (RuntimeError, ValueError, MemoryError) as exc:  # e.g. out of memory for a huge image
            message = (f'{path}: inference failed for this {image.shape[1]}x{image.shape[0]} image: '
                       f'{type(exc).__name__}: {(str(exc).splitlines() or [""])[0][:300]}')
            tqdm.write(f'error: {message}', file=sys.stderr)
            results.append(dict(image=path, error=message))
            failures += 1
            continue
        used.add(Path(picture).name)
        pictures.append(picture)
        results.append(dict(image=path, picture=picture, height=image.shape[0], width=image.shape[1],
                            **raw_results(sample, scope, classes)))
    summary = dict(config=args.config, checkpoint=args.checkpoint, task=TASKS[scope],
                   classes=classes, images=results)
    (out_dir / 'results.json').write_text(json.dumps(summary))
    if args.mosaic and pictures:
        write_mosaic(pictures, args.mosaic)
    print(f'{len(pictures)} of {len(inputs)} images done: pictures and results.json in {out_dir}'
          + (f', mosaic {args.mosaic}' if args.mosaic and pictures else ''))
    if failures:
        sys.exit(f'{failures} input(s) failed: see the errors above')


if __name__ == '__main__':
    main()
