"""Prediction with mmdet's and mmseg's own inferencers on this toolkit's configs and checkpoints.

The stock ``DetInferencer`` and ``MMSegInferencer`` take a toolkit config and checkpoint as they
take any other (MMEngine's checkpoint loader reads through the toolkit's checked reader,
``io/checkpoint_schemes.py``). They load weights non-strictly,
though: a segmentation checkpoint given to a detection config leaves a randomly initialised model
behind a warning. ``build_inferencer`` returns the stock class with a check that refuses it.
"""
import functools
from typing import Optional, Sequence, Union

import numpy as np
import torch
from mmengine.config import Config
from mmengine.infer import BaseInferencer
from mmengine.structures import BaseDataElement, InstanceData, PixelData
from pycocotools import mask as mask_utils
from torch import nn
from torchvision.ops import nms

from xcit_launch.known_warnings import without_known_prints

from .compile_option import take_compile_option
from .engine.distributed.cuda_ops import check_cuda_ops
from .engine.distributed.process_group import gpus_present
from .io.averaged_weights import select_weights
from .io.checkpoint import CheckpointError
from .io.checkpoint_schemes import install_checked_schemes
from .io.weights import check_matches_model
from .tasks import Task, task_of_config, task_of_model, task_of_state


class CheckedWeights:
    """Mixin for a stock inferencer: refuse weights of the other task or of another model; of a checkpoint
    trained with ``--ema``, take the average (or, with ``raw_weights``, the trained weights)."""

    def __init__(self, model: Union[str, Config], weights: Optional[str] = None, raw_weights: bool = False,
                 **kwargs) -> None:
        self.weights_source, self.raw_weights, self.weights_used = weights, raw_weights, None
        self.config_source = (model if isinstance(model, str)
                              else getattr(model, 'filename', None) or 'the config')
        with without_known_prints():  # MMEngine's bare notice as it reads the weights: weights_used names them
            super().__init__(model=model, weights=weights, **kwargs)

    def _load_weights_to_model(self, model: nn.Module, checkpoint: Optional[dict], cfg: Config) -> None:
        """Check the checkpoint's task and keys against the model, then load it as the stock class does."""
        if checkpoint is not None:
            state = checkpoint.get('state_dict')
            if not isinstance(state, dict):
                raise CheckpointError(f'{self.weights_source} is not a training checkpoint (no state_dict)')
            task, found = task_of_model(model), task_of_state(state)
            if found and found is not task:
                raise CheckpointError(f'{self.weights_source} holds a {found.name} model but '
                                      f'{self.config_source} builds a {task.name} model: pass the '
                                      f'config it was trained with')
            check_matches_model(model, self.weights_source, checkpoint)  # (read once: its contents)
            self.weights_used = select_weights(checkpoint, self.raw_weights, self.weights_source)
        super()._load_weights_to_model(model, checkpoint, cfg)


@functools.lru_cache(maxsize=None)
def inferencer_class(task: Task) -> type:
    """The task's stock inferencer with ``CheckedWeights`` (imports mmdet or mmseg now)."""
    stock = task.inferencer_class()
    return type(f'Checked{stock.__name__}', (CheckedWeights, stock), {'__module__': __name__})


def default_device() -> str:
    """The current CUDA device where torch sees a GPU, else the CPU."""
    return f'cuda:{torch.cuda.current_device()}' if gpus_present() else 'cpu'


def build_inferencer(config: Union[str, Config], weights: str, device: Optional[str] = None,
                     raw_weights: bool = False) -> BaseInferencer:
    """The stock inferencer of the config's task on ``weights`` (on ``device``, default ``default_device()``;
    of an EMA checkpoint the average unless ``raw_weights``), refusing a checkpoint of the other task or of
    another model with ``CheckpointError``, and an mmcv build without ops for a GPU asked for with
    RuntimeError. MMEngine's checkpoint schemes read checked from then on (``install_checked_schemes``)."""
    install_checked_schemes()
    device = device or default_device()
    if device.startswith('cuda'):
        check_cuda_ops(torch.device(device).index)  # that GPU only (None: the current one)
    cfg = (Config.fromfile(config) if isinstance(config, str) else config).copy()
    cfg.model = take_compile_option(cfg.model)[0]  # the run's option: inference runs the eager model
    return inferencer_class(task_of_config(cfg))(model=cfg, weights=weights, device=device,
                                                 raw_weights=raw_weights)


def predict_image(inferencer: BaseInferencer, image: np.ndarray) -> BaseDataElement:
    """One BGR image through an inferencer's test pipeline and model; returns its data sample."""
    return inferencer.forward(inferencer.collate_fn([inferencer.pipeline(image)]))[0]


def predict(model: nn.Module, image: torch.Tensor) -> BaseDataElement:
    """Run ``model.test_step`` on one (3, H, W) uint8 image, without a pipeline; returns its data sample.

    Works for mmdet detectors (``pred_instances``) and mmseg segmentors (``pred_sem_seg``).
    """
    h, w = image.shape[1:]
    sample = task_of_model(model).data_sample_class()(metainfo=dict(
        img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1., 1.)))
    with torch.no_grad():
        return model.test_step(dict(inputs=[image], data_samples=[sample]))[0]


# tools/infer.py's default --overlap-iou: boxes overlapping more are drawn once
DRAWN_OVERLAP_IOU = 0.7


def drawn_instances(instances: InstanceData, score_thr: float,
                    overlap_iou: float = DRAWN_OVERLAP_IOU) -> InstanceData:
    """The instances a picture shows: those scoring ``score_thr`` or more and, of boxes that overlap
    at an IoU above ``overlap_iou``, only the best scoring, whatever its class (1 keeps them all).

    The detector scores every class of a box on its own, so one object can come out as two classes
    with the same box (a rectangle and an ellipse, say); the picture shows it once, under its best
    class. Only for the drawing: the results and the metrics keep every detection."""
    kept = instances[instances.scores >= score_thr]
    if overlap_iou >= 1 or not len(kept):
        return kept
    return kept[nms(kept.bboxes.float(), kept.scores.float(), overlap_iou)]


def drawing_sample(sample: BaseDataElement, task: Task, score_thr: float,
                   overlap_iou: float = DRAWN_OVERLAP_IOU) -> BaseDataElement:
    """``sample`` with only its ``drawn_instances`` (a shallow copy), or as it is for a segmentation."""
    if not task.draws_scores:
        return sample
    sample = sample.clone()
    setattr(sample, task.prediction, drawn_instances(getattr(sample, task.prediction), score_thr, overlap_iou))
    return sample


def _encode_mask(mask: np.ndarray) -> dict:
    """A binary mask as COCO RLE with a text ``counts``."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return dict(size=list(rle['size']), counts=rle['counts'].decode('ascii'))


def prediction_record(sample: BaseDataElement, task: Task, classes: Sequence[str]) -> dict:
    """The prediction of one data sample as JSON-ready lists: instances (boxes in pixels, masks
    as RLE) or the segments of each class present."""
    def name(label: int) -> str:
        return classes[label] if label < len(classes) else str(label)
    pred = getattr(sample, task.prediction)
    if isinstance(pred, PixelData):
        labels = pred.data[0].cpu().numpy()
        return dict(segments=[
            dict(label=int(label), **{'class': name(int(label))}, area=int((labels == label).sum()),
                 mask=_encode_mask(labels == label))
            for label in np.unique(labels)])
    inst = pred.cpu()
    masks = inst.masks.numpy() if 'masks' in inst else [None] * len(inst)
    return dict(instances=[
        dict(label=int(label), **{'class': name(int(label))}, score=round(float(score), 4),
             bbox=[round(float(v), 2) for v in bbox],
             **(dict(mask=_encode_mask(mask)) if mask is not None else {}))
        for label, score, bbox, mask in zip(inst.labels, inst.scores, inst.bboxes, masks)])
