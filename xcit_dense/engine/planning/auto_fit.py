"""``--auto-fit``: a run that does not fit in memory re-plans itself before its first step, with the same
effective batch.

Each rank probes a copy of the model (``MemoryProbe``: built from the config without weights init, SyncBN
as BN, no DDP) with one forward and backward under the run's mixed precision and activation checkpointing,
at the planned images per GPU, on the largest padded input the training pipeline can produce
(``probe_shape``, from datasets/largest_input.py) and a stated number of ground-truth instances per image
(``auto_fit.instances``). On a GPU a try fits when its peak reserved memory plus DDP's gradient buckets
(one copy of the parameters), the optimizer's state and, with ``--ema``, the averaged copy of the weights
(by arithmetic) stays within 90% of the memory this process may use; on a CPU when it ran without an
allocation failure. The probe runs the backbone eagerly (a ``compile=True`` backbone's memory may differ).
The ranks agree after every try (on the control group): while any rank does not fit, all try the next
candidate, the divisors d of images x accumulation below the planned images with accumulation
images x accumulation / d, so the effective batch, learning rate and schedule stay the recipe's; ``fit``
returns the requested batch plan re-planned for the candidate every rank fits.
A failure that is not an allocation failure, on any rank, stops every rank with that rank's message.

The result is recorded in checkpoints (``planning/auto_fit_record_hook.py``, meta key ``auto_fit``); a resume
with the same request, world size and device reuses it without probing (``engine/planning/run_config.py``).
"""
import gc
import socket
from copy import deepcopy
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from mmengine.config import Config

from ...allocation_failures import is_out_of_memory
from ...datasets.largest_input import largest_input
from ...errors import ToolkitError
from ...io.checkpoint_schema import auto_fit_of
from ..distributed.collectives import gather_objects
from ..distributed.process_group import gpus_present
from .auto_fit_record_hook import AUTO_FIT_KEY
from .batch_plan import BatchPlan
from .out_of_memory import OutOfMemoryAdvice, advice

DEFAULT_INSTANCES = 50  # ground-truth instances per probe image: above COCO's mean (7.3), below its largest images
HEADROOM = 0.9  # the share of the usable memory a fitted plan may fill
# optimizer state per parameter, in copies of the parameters (AdamW: two moments; SGD: momentum)
OPTIMIZER_STATE = {'AdamW': 2, 'Adam': 2, 'SGD': 1}


# torch's BatchNorm refusing to train on one value per channel: one image per process through a layer
# whose input is pooled to 1x1 (UperNet's pyramid pooling)
BATCH_NORM_ON_ONE = 'Expected more than 1 value per channel when training'
ONE_IMAGE_WITH_BN = (
    'one image per process gives BatchNorm on features pooled to 1x1 (UperNet\'s pyramid pooling) one value '
    'per channel, and BN cannot train on one. Keep 2 images per GPU and save memory with '
    'model.backbone.with_cp=True (or --amp on GPUs); or train 1 image per GPU on several GPUs with SyncBN, '
    'whose statistics span the processes (set train_dataloader.batch_size=1 and --accumulation yourself: '
    'the probe runs SyncBN as BN); or use GroupNorm in the heads '
    "(norm_cfg=dict(type='GN', num_groups=32, requires_grad=True))")


class AutoFitError(ToolkitError):
    """The probe could not run (a bad ``auto_fit`` config, or a rank's failure that is not about memory)."""


@dataclass(frozen=True)
class FitRecord:
    """What a checkpoint records of an auto-fitted run."""

    requested: Tuple[int, int]  # (images per GPU, accumulation) asked for
    fitted: Optional[Tuple[int, int]]  # what the probe chose (None: not yet)
    world_size: int
    device: str  # the GPU's name, or 'cpu'
    total_memory: int  # bytes (the host's on CPUs)

    def with_fit(self, fitted: Tuple[int, int]) -> 'FitRecord':
        return replace(self, fitted=tuple(fitted))

    def as_meta(self) -> dict:
        return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(self).items()}

    def differs_from(self, request: 'FitRecord') -> Optional[str]:
        """None when ``request`` (this run's, before fitting) may reuse this record's fit, else why not."""
        for field, what in (('requested', 'requested plan (images per GPU, accumulation)'),
                            ('world_size', 'world size'), ('device', 'device'), ('total_memory', 'device memory')):
            if getattr(self, field) != getattr(request, field):
                return f'the {what} changed ({getattr(self, field)} -> {getattr(request, field)})'
        return None


def candidates(images: int, accumulation: int) -> List[Tuple[int, int]]:
    """The planned (images, accumulation), then the same product with fewer images, the most images first."""
    total = images * accumulation
    return [(images, accumulation)] + [(d, total // d) for d in range(images - 1, 0, -1) if total % d == 0]


# ---------------------------------------------------------------- the probe's input
def _round_up(value: int, divisor: int) -> int:
    return -(-value // divisor) * divisor


def _train_dataset(cfg: Config) -> dict:
    dataset = cfg.train_dataloader.dataset
    while 'pipeline' not in dataset and 'dataset' in dataset:  # wrappers (the sample checks, repeats)
        dataset = dataset['dataset']
    return dataset


def probe_shape(cfg: Config) -> Tuple[int, int]:
    """(height, width) of the largest padded batch the training pipeline (datasets/largest_input.py) and
    data preprocessor produce: a square of the longest side, or, where batches are grouped by aspect ratio,
    long side x short side; ``auto_fit.probe_shape`` when the pipeline does not bound the size."""
    given = (cfg.get('auto_fit') or {}).get('probe_shape')
    if given is not None:
        if (not isinstance(given, (list, tuple)) or len(given) != 2
                or not all(isinstance(v, int) and v > 0 for v in given)):
            raise AutoFitError(f'auto_fit.probe_shape must be (height, width) in pixels, got {given!r}')
        return tuple(given)
    bound = largest_input(_train_dataset(cfg).get('pipeline') or [])
    if bound is None:
        raise AutoFitError('the training pipeline does not bound the image size (no Resize, RandomResize, '
                           'RandomChoiceResize, RandomCrop or Pad with a size): set auto_fit.probe_shape = '
                           '(height, width) of the largest batch')
    preprocessor = cfg.model.get('data_preprocessor') or {}
    long_side, short_side = bound
    if preprocessor.get('size') is not None:  # padded up to a fixed size
        size = preprocessor['size']
        height, width = (size, size) if isinstance(size, int) else size
        long_side, short_side = max(long_side, height, width), max(short_side, min(height, width))
    divisor = preprocessor.get('pad_size_divisor') or preprocessor.get('size_divisor') or 1
    long_side, short_side = _round_up(long_side, divisor), _round_up(short_side, divisor)
    grouped = 'AspectRatio' in str((cfg.train_dataloader.get('batch_sampler') or {}).get('type', ''))
    return (short_side, long_side) if grouped else (long_side, long_side)


# ---------------------------------------------------------------- the probe
def synthetic_batch(cfg: Config, images: int, shape: Tuple[int, int], instances: int,
                    generator: torch.Generator) -> Dict[str, Any]:
    """A batch as the data loader gives it (uint8 images, data samples with ground truth) for the
    config's task: boxes and masks for mmdet, a label map for mmseg."""
    h, w = shape
    inputs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for _ in range(images)]
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1.0, 1.0), flip=False)
    if cfg.get('default_scope') == 'mmseg':
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        classes = cfg.model.decode_head.num_classes
        samples = []
        for _ in range(images):
            sample = SegDataSample(metainfo=meta)
            sample.gt_sem_seg = PixelData(data=torch.randint(0, classes, (1, h, w), generator=generator))
            samples.append(sample)
        return dict(inputs=inputs, data_samples=samples)
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    classes = _num_classes(cfg.model)
    samples = []
    for _ in range(images):
        xy = torch.rand(instances, 2, generator=generator) * torch.tensor([w * 0.8, h * 0.8])
        wh = 16 + torch.rand(instances, 2, generator=generator) * torch.tensor([w * 0.2, h * 0.2])
        boxes = torch.cat([xy, xy + wh], 1)
        masks = np.zeros((instances, h, w), dtype=np.uint8)
        for mask, (x1, y1, x2, y2) in zip(masks, boxes.int().tolist()):
            mask[y1:y2, x1:x2] = 1
        sample = DetDataSample(metainfo=meta)
        sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.randint(0, classes, (instances,),
                                                                                 generator=generator),
                                           masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _num_classes(model_cfg) -> int:
    """The first ``num_classes`` in the model config (the heads agree on it)."""
    stack = [model_cfg]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get('num_classes'), int):
                return node['num_classes']
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return 1


def _build_probe_model(model_cfg: dict, device: torch.device) -> torch.nn.Module:
    from mmengine.registry import MODELS
    model = MODELS.build(deepcopy(model_cfg))  # no init_weights: the probe needs shapes, not values
    return model.to(device).train()


def _peak_bytes_of_one_step(model: torch.nn.Module, batch: Dict[str, Any], amp: Optional[str],
                            device: torch.device) -> int:
    """One forward and backward; the peak reserved bytes on a GPU (0 on CPUs)."""
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    dtype = {'fp16': torch.float16, 'bf16': torch.bfloat16}.get(amp) if device.type == 'cuda' else None
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        data = model.data_preprocessor(batch, True)
        losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
    loss.backward()
    model.zero_grad(set_to_none=True)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_reserved(device)
    return 0


def _usable_bytes(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return int(min(free, torch.cuda.get_per_process_memory_fraction(device) * total))


def extra_bytes(cfg: Config, model: torch.nn.Module, ema: bool) -> int:
    """What the run holds beside the probe's peak, by arithmetic: DDP's gradient buckets (one copy of the
    trained parameters), the optimizer's state and, with ``ema``, the averaged copy of every parameter
    and buffer (``training/model_ema_hook.py``)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    optimizer = (cfg.get('optim_wrapper') or {}).get('optimizer') or {}
    average = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) if ema else 0
    return params * (1 + OPTIMIZER_STATE.get(optimizer.get('type'), 2)) + average


@dataclass(frozen=True)
class Outcome:
    """One rank's result for one candidate: 'fit', 'out of memory' or 'failed', with what it measured."""

    rank: int
    host: str
    result: str
    detail: str


class MemoryProbe:
    """auto-fit's measurement on this rank: a copy of the model built from the probe's model config, on
    this rank's device, and one forward and backward of a synthetic batch of the largest input per number
    of images tried. Used as a context manager: the model is freed on leaving it.

    Raises ``AutoFitError`` when the config does not say the probe's shape (``probe_shape``)."""

    def __init__(self, cfg: Config, probe_model_cfg: dict, amp: Optional[str], ema: bool) -> None:
        self.cfg = cfg
        self.instances = (cfg.get('auto_fit') or {}).get('instances', DEFAULT_INSTANCES)
        self.shape = probe_shape(cfg)
        self.amp = amp
        self.device = torch.device('cuda', torch.cuda.current_device()) if gpus_present() else torch.device('cpu')
        self.usable = _usable_bytes(self.device) if self.on_gpu else 0
        self.model = _build_probe_model(probe_model_cfg, self.device)
        self.extra = extra_bytes(cfg, self.model, ema)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == 'cuda'

    @property
    def with_cp(self) -> bool:
        """Whether the backbone checkpoints its activations (``model.backbone.with_cp``)."""
        return bool((self.cfg.model.get('backbone') or {}).get('with_cp'))

    def __enter__(self) -> 'MemoryProbe':
        return self

    def __exit__(self, *exc_info: Any) -> None:
        del self.model
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()

    def probing_line(self) -> str:
        """The log line that says what is probed."""
        h, w = self.shape
        return (f'auto-fit: probing {h}x{w} inputs with {self.instances} instances each '
                f'(amp {self.amp if self.on_gpu and self.amp else "off"}, with_cp {self.with_cp})')

    def measure(self, images: int) -> Outcome:
        """This rank's outcome for ``images`` per GPU; a failure is reported, not raised, so that every rank
        reaches the agreement after the try."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        host = socket.gethostname()
        batch = synthetic_batch(self.cfg, images, self.shape, self.instances, torch.Generator().manual_seed(rank))
        try:
            peak = _peak_bytes_of_one_step(self.model, batch, self.amp, self.device)
        except Exception as exc:  # every rank reports before any stops: no rank is left in the agreement
            self.model.zero_grad(set_to_none=True)
            gist = f'{type(exc).__name__}: {" ".join(str(exc).split())[:500]}'  # frames dropped
            return Outcome(rank, host, 'out of memory' if is_out_of_memory(exc) else 'failed', gist)
        finally:
            del batch
            gc.collect()
            if self.on_gpu:
                torch.cuda.empty_cache()
        if not self.on_gpu:
            return Outcome(rank, host, 'fit', 'ran without an allocation failure')
        need = peak + self.extra
        detail = (f'{peak / 2**30:.2f} GiB peak reserved + {self.extra / 2**30:.2f} GiB buckets, optimizer state '
                  f'and any EMA copy of {HEADROOM:.0%} x {self.usable / 2**30:.2f} GiB usable')
        return Outcome(rank, host, 'fit' if need <= HEADROOM * self.usable else 'out of memory', detail)


# ---------------------------------------------------------------- the choice
def fit(cfg: Config, probe_model_cfg: dict, plan: BatchPlan, amp: Optional[str],
        ema: bool = False) -> Tuple[BatchPlan, List[str]]:
    """The requested ``plan`` at the most images per GPU that every rank fits (``MemoryProbe`` with a
    model built from ``probe_model_cfg``: the run's model with SyncBN as BN, without the backbone's
    ``compile`` option, the probe runs eagerly), and the log lines. ``ema``: the run keeps an EMA copy of
    the weights.

    Raises ``OutOfMemoryAdvice`` when one image per GPU does not fit, ``AutoFitError`` when a rank failed
    otherwise (its message) or the config does not say the probe's shape."""
    with MemoryProbe(cfg, probe_model_cfg, amp, ema) as probe:
        lines = [probe.probing_line()]
        for images, accumulation in candidates(plan.images_per_gpu, plan.accumulation):
            outcomes = gather_objects(probe.measure(images))
            failed = next((o for o in outcomes if o.result == 'failed'), None)
            if failed is not None:
                why = f'; {ONE_IMAGE_WITH_BN}' if BATCH_NORM_ON_ONE in failed.detail else ''
                raise AutoFitError(f'the auto-fit probe failed on rank {failed.rank} (host {failed.host}) at '
                                   f'{images} images per GPU: {failed.detail}{why}')
            short = [o for o in outcomes if o.result != 'fit']
            lines.append(f'auto-fit: {images} images per GPU x accumulation {accumulation}: '
                         + ('fits on every rank' if not short else 'out of memory on rank(s) '
                            + ', '.join(f'{o.rank} ({o.host}: {o.detail})' for o in short)))
            if not short:
                return plan.with_batch(images, accumulation), lines
    options = advice(plan, bool(amp), probe.with_cp, probe.on_gpu)[1:]  # not --auto-fit again
    what = '\n'.join(f'  - {line}' for line in options)
    raise OutOfMemoryAdvice('auto-fit: even 1 image per GPU does not fit:\n' + '\n'.join(lines[1:])
                            + f'\nWhat would fit:\n{what}')


def device_record() -> Tuple[str, int]:
    """This rank's device name and total memory (the host's on CPUs)."""
    if gpus_present():
        index = torch.cuda.current_device()
        return torch.cuda.get_device_name(index), torch.cuda.get_device_properties(index).total_memory
    with open('/proc/meminfo') as meminfo:
        total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith('MemTotal:'))
    return 'cpu', total


def record_from(meta: Optional[dict]) -> Optional[FitRecord]:
    """The ``FitRecord`` a checkpoint's meta holds (``AutoFitHook``), if any; SchemaError for one whose
    fields are not of their types (io/checkpoint_schema.py)."""
    found = auto_fit_of(meta or {}, AUTO_FIT_KEY)
    if found is None:
        return None
    return FitRecord(found['requested'], found['fitted'], found['world_size'], found['device'],
                     found['total_memory'])
