"""Pictures of predictions, written by tools/infer.py and tools/test.py --show-dir alike: one file
per image named after it (``<stem>.png``, then ``<stem>_2.png``, ... where stems repeat), boxes
clipped to the picture before drawing (MMEngine warns about every box that touches the edge),
written through no link (io/output_files.py), and drawing that reports its failure instead of
stopping the tool."""
from pathlib import Path
from typing import Optional

import torch
from mmengine.structures import BaseDataElement, InstanceData

from xcit_launch.image_names import picture_name

from .errors import UnsafeOutputError
from .io.output_files import writing

__all__ = ['clip_boxes', 'draw_picture', 'picture_name']


def clip_boxes(sample: BaseDataElement, height: int, width: int) -> BaseDataElement:
    """The sample with the boxes of its predicted and ground-truth instances inside a ``height`` x
    ``width`` picture, as tensors (a shallow copy: the given sample is unchanged)."""
    sample = sample.clone()
    for key in ('pred_instances', 'gt_instances'):
        instances = sample.get(key)
        if not isinstance(instances, InstanceData) or 'bboxes' not in instances:
            continue
        boxes = getattr(instances.bboxes, 'tensor', instances.bboxes)  # mmdet's boxes type holds a tensor
        if isinstance(boxes, torch.Tensor):
            instances = instances.clone()
            boxes = boxes.clone()
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width - 1)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height - 1)
            instances.bboxes = boxes
            sample.set_field(instances, key)
    return sample


def draw_picture(visualizer, image, sample: BaseDataElement, out_file: str, **options) -> Optional[str]:
    """Draw ``sample`` on the RGB ``image`` into ``out_file`` with the task's visualizer; returns why
    drawing failed (the tool goes on, the prediction is kept), or None. A link at ``out_file`` is
    refused, never drawn through."""
    try:
        with writing(out_file) as path:
            visualizer.add_datasample(Path(out_file).stem, image, clip_boxes(sample, *image.shape[:2]),
                                      show=False, out_file=path, **options)
    except UnsafeOutputError as exc:
        return str(exc)
    except Exception as exc:  # a drawing is never worth the run: any error is reported, not raised
        return f'{out_file}: not drawn: {type(exc).__name__}: {(str(exc).splitlines() or [""])[0][:300]}'
    return None
