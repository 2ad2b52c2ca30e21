"""Whole detectors and segmentors side by side in one process: a training step (forward, losses,
backward, AdamW step) and inference, at a (height, width) size, time per part and peak tensor memory.

The models' steps alternate (the order rotates every round) so that a busy machine slows both alike;
ratios are of the medians. Forward parts are timed by wrapping the models' own methods (backbone,
neck, RPN, RoI heads; decode and auxiliary heads) and their loss methods (``loss``: targets and
losses), each part's own time (a part run inside another is not counted in the outer one).
Backward is timed whole, and split per part from one profiled step: each autograd node's time goes
to the part whose forward built it (the profiler's sequence numbers tie the two), not to the part
where the gradient happens to arrive.
"""
import statistics
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.autograd.profiler import record_function

from xcit_dense.tasks import task_of_model

from .catalogue import MODELS
from .measure import random_samples, tensor_peak_bytes

# the methods timed as parts: (attribute path, method, part), by model kind and mode
PARTS = {
    ('detector', 'train'): (('backbone', 'forward', 'backbone'), ('neck', 'forward', 'neck'),
                            ('rpn_head', 'loss_and_predict', 'rpn_head'), ('rpn_head', 'loss_by_feat', 'loss'),
                            ('roi_head', 'loss', 'roi_head'), ('roi_head.bbox_head', 'loss_and_target', 'loss'),
                            ('roi_head.mask_head', 'loss_and_target', 'loss')),
    ('detector', 'infer'): (('backbone', 'forward', 'backbone'), ('neck', 'forward', 'neck'),
                            ('rpn_head', 'predict', 'rpn_head'), ('roi_head', 'predict', 'roi_head')),
    ('segmentor', 'train'): (('backbone', 'forward', 'backbone'), ('decode_head', 'loss', 'decode_head'),
                             ('decode_head', 'loss_by_feat', 'loss'), ('auxiliary_head', 'loss', 'auxiliary_head'),
                             ('auxiliary_head', 'loss_by_feat', 'loss')),
    ('segmentor', 'infer'): (('backbone', 'forward', 'backbone'), ('decode_head', 'predict', 'decode_head')),
}
PROFILE_TAG = 'part:'  # the profiler ranges of the parts
BACKWARD_EVENT = 'autograd::engine::evaluate_function: '


class PartTimer:
    """Seconds of each named part during the current step, its own: time in a nested part is the inner one's."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self._stack: List[str] = []
        self._since = 0.0

    def _charge(self) -> None:
        now = time.perf_counter()
        if self._stack:
            self.seconds[self._stack[-1]] = self.seconds.get(self._stack[-1], 0.0) + now - self._since
        self._since = now

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time a block under ``name`` (a profiler range too, which ties autograd nodes to it)."""
        self._charge()
        self._stack.append(name)
        try:
            with record_function(PROFILE_TAG + name):
                yield
        finally:
            self._charge()
            self._stack.pop()

    def wrap(self, owner: nn.Module, method: str, name: str) -> Callable[[], None]:
        """Time ``owner.method`` under ``name``; returns the function that restores the method."""
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            with self.part(name):
                return original(*args, **kwargs)
        setattr(owner, method, timed)
        return lambda: delattr(owner, method)


def backward_node_seconds(events: Iterable) -> Dict[Tuple[str, str], float]:
    """Seconds of the backward pass per (part whose forward built the node, node name); ``other``:
    nodes built outside the parts. A node's name is the forward operator's (``AddmmBackward0``).

    ``events`` are a profiled step's raw events (``prof.profiler.kineto_results.events()``): a
    forward operator and the backward node it recorded share a sequence number, and the operator
    lies in its part's range (the innermost one, of the ranges ``PartTimer.part`` records).
    """
    events = list(events)
    ranges = sorted(((e.start_ns(), e.end_ns(), e.name()[len(PROFILE_TAG):]) for e in events
                     if e.name().startswith(PROFILE_TAG)), key=lambda r: r[0] - r[1])  # the widest first
    built_in: Dict[int, str] = {}
    for e in events:
        if e.sequence_nr() >= 0 and not e.name().startswith((BACKWARD_EVENT, PROFILE_TAG)):
            parts = [name for begin, end, name in ranges if begin <= e.start_ns() <= end]
            if parts and parts[-1] not in ('backward', 'optimizer'):
                built_in.setdefault(e.sequence_nr(), parts[-1])
    seconds: Dict[Tuple[str, str], float] = {}
    for e in events:
        if e.name().startswith(BACKWARD_EVENT):
            key = built_in.get(e.sequence_nr(), 'other'), e.name()[len(BACKWARD_EVENT):]
            seconds[key] = seconds.get(key, 0.0) + e.duration_ns() / 1e9
    return seconds


def backward_seconds(events: Iterable) -> Dict[str, float]:
    """Seconds of the backward pass per part whose forward built each autograd node (see
    ``backward_node_seconds``)."""
    seconds: Dict[str, float] = {}
    for (part, _), s in backward_node_seconds(events).items():
        seconds[part] = seconds.get(part, 0.0) + s
    return seconds


def backward_aten_seconds(function_events: Iterable, by_shape: Sequence[str] = ()) -> Dict[str, float]:
    """Self seconds per ATen operator run inside the backward (``prof.events()``): the kernels the
    backward nodes spend their time in. The operators named in ``by_shape`` are split by their
    inputs' shapes (the profile recorded with shapes): which layer's kernel it was."""
    seconds: Dict[str, float] = {}
    for e in function_events:
        if not e.name.startswith('aten::'):
            continue
        parent = e.cpu_parent
        while parent is not None and parent.name != PROFILE_TAG + 'backward':
            parent = parent.cpu_parent
        if parent is not None:
            key = e.name
            if e.name in by_shape:
                key += ' ' + ' '.join(str(list(shape)) for shape in e.input_shapes if shape)
            seconds[key] = seconds.get(key, 0.0) + e.self_cpu_time_total / 1e6
    return seconds


class WholeModel:
    """One catalogue model (random weights) with its random batch, AdamW and step functions."""

    def __init__(self, name: str, size: Tuple[int, int], batch: int, instances: int = 7,
                 options: Optional[dict] = None, fixed_proposals: bool = False) -> None:
        """``options``: config overrides on top of the catalogue's (e.g. a smaller model);
        ``fixed_proposals``: the RoI heads get proposals that do not depend on the model, not the RPN's
        (detectors: with random weights the RPN's decide how many RoIs are positive, see ``_fixed``)."""
        from xcit_dense.builder import build_model
        torch.manual_seed(0)
        self.name, self.kind = name, MODELS[name]['kind']
        self.model = build_model(MODELS[name]['config'], {'model.backbone.init_cfg': None, **(options or {})})
        self.params = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.05)
        self.timer = PartTimer()
        self.size, self.instances, self.fixed_proposals = size, instances, fixed_proposals
        self.positive_rois = 0  # RoIs the box head sampled as positives in the last training forward
        self.rebatch(batch)

    def rebatch(self, batch: int) -> None:
        """Use a random batch of ``batch`` images (the same for every model, seeded), made as a
        training loader's batch is: pixel values through the model's own data preprocessor, which
        normalises them and pads the batch (and masks) to its size divisor, as users' batches are."""
        self.batch = batch
        images, samples = random_samples(task_of_model(self.model), batch, self.size, self.instances)
        pixels = [(image * 50 + 128).clamp(0, 255) for image in images]  # noise in the 8-bit range
        data = self.model.data_preprocessor(dict(inputs=pixels, data_samples=samples), True)
        self.inputs, self.samples = data['inputs'], data['data_samples']

    def _parts(self, mode: str) -> List[Callable[[], None]]:
        restores = []
        for path, method, name in PARTS[(self.kind, 'train' if mode == 'loss' else mode)]:
            owner = self.model
            for attr in path.split('.'):
                owner = getattr(owner, attr, None)
            if owner is not None and hasattr(owner, method):
                restores.append(self.timer.wrap(owner, method, name))
        if self.kind == 'detector' and mode != 'infer':
            restores.append(self._count_positives(self.model.roi_head.bbox_sampler))
        if self.kind == 'detector' and self.fixed_proposals:
            restores.append(self._replace_proposals(self.model.rpn_head, mode))
        return restores

    def _count_positives(self, sampler) -> Callable[[], None]:
        original = sampler.sample
        self.positive_rois = 0

        def counted(*args, **kwargs):
            result = original(*args, **kwargs)
            self.positive_rois += len(result.pos_inds)
            return result
        sampler.sample = counted
        return lambda: delattr(sampler, 'sample')

    def _replace_proposals(self, rpn_head, mode: str) -> Callable[[], None]:
        method = 'predict' if mode == 'infer' else 'loss_and_predict'
        original = getattr(rpn_head, method)

        def replaced(*args, **kwargs):
            if mode == 'infer':
                return [self._fixed(p, k) for k, p in enumerate(original(*args, **kwargs))]
            losses, proposals = original(*args, **kwargs)
            return losses, [self._fixed(p, k) for k, p in enumerate(proposals)]
        setattr(rpn_head, method, replaced)
        return lambda: setattr(rpn_head, method, original)  # the part timer's wrap, removed after

    def _fixed(self, proposals, index: int):
        """Proposals of image ``index`` that do not depend on the model: as many as the RPN keeps at
        most (in training or at inference), a quarter of them jittered ground-truth boxes, the rest
        random boxes (seeded)."""
        gen = torch.Generator().manual_seed(index)
        cfg = self.model.train_cfg.rpn_proposal if self.model.training else self.model.test_cfg.rpn
        num, (height, width) = cfg.max_per_img, self.size
        gt = self.samples[index].gt_instances.bboxes
        near = gt[torch.randint(len(gt), (num // 4,), generator=gen)]
        scale = (near[:, 2:] - near[:, :2]).repeat(1, 2)
        near = near + 0.1 * scale * torch.randn(near.shape, generator=gen)
        xy = torch.rand(num - len(near), 2, generator=gen) * torch.tensor([width, height]) * 0.8
        wh = torch.tensor([width, height]) * (0.02 + 0.3 * torch.rand(num - len(near), 2, generator=gen))
        boxes = torch.cat([near, torch.cat([xy, xy + wh], 1)]).to(proposals.bboxes)
        return proposals.new(bboxes=boxes, scores=torch.ones(num).to(proposals.scores),
                             labels=torch.zeros(num, dtype=torch.long, device=boxes.device))

    def step(self, mode: str) -> Dict[str, float]:
        """One training step (``train``), its forward and losses alone (``loss``, no gradients) or
        inference; seconds in all (``total``), per part and outside them (``other``)."""
        self.timer.seconds = {}
        restores = self._parts(mode)
        start = time.perf_counter()
        try:
            if mode == 'infer':
                self.model.eval()
                with torch.no_grad():
                    self.model.predict(self.inputs, self.samples)
            elif mode == 'loss':
                self.model.train()
                with torch.no_grad():
                    self.model.loss(self.inputs, self.samples)
            else:
                self.model.train()
                self.optimizer.zero_grad(set_to_none=True)
                losses = self.model.loss(self.inputs, self.samples)
                loss = self.model.parse_losses(losses)[0]
                with self.timer.part('backward'):
                    loss.backward()
                with self.timer.part('optimizer'):
                    self.optimizer.step()
        finally:
            for restore in reversed(restores):
                restore()
        total = time.perf_counter() - start
        return dict(self.timer.seconds, other=total - sum(self.timer.seconds.values()), total=total)

    def profiled_step(self, record_shapes: bool = False):
        """One training step under the profiler (which slows it); the profile."""
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
            self.step('train')
        return prof

    def backward_parts(self) -> Dict[str, float]:
        """One profiled training step's backward seconds per part that built the nodes."""
        return backward_seconds(self.profiled_step().profiler.kineto_results.events())

    def peak_tensor_bytes(self, mode: str) -> int:
        """Peak tensor bytes one step allocates above what is live before it (weights, AdamW state)."""
        return tensor_peak_bytes(self.model, lambda: self.step(mode)) or 0

    def state_bytes(self) -> int:
        """Weights, gradients and the two AdamW moments in fp32: what a GPU holds besides activations."""
        return 4 * 4 * self.params


def side_by_side(models: Sequence[WholeModel], mode: str, rounds: int, warmup: int = 1,
                 log: Callable[[str], None] = print) -> Dict[str, Dict[str, float]]:
    """Median seconds (total and per part) of ``models``' steps, alternated, after ``warmup`` each."""
    for _ in range(warmup):
        for m in models:
            m.step(mode)
    runs: Dict[str, List[Dict[str, float]]] = {m.name: [] for m in models}
    for r in range(rounds):
        for m in list(models[r % len(models):]) + list(models[:r % len(models)]):
            runs[m.name].append(m.step(mode))
            log(f'{mode} b{m.batch} round {r + 1}: {m.name} {runs[m.name][-1]["total"]:.1f} s')
    return {name: {k: statistics.median(run[k] for run in done) for k in done[0]} for name, done in runs.items()}
