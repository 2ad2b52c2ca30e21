"""Whole detectors and segmentors side by side in one process: a training step (forward, losses,
backward, AdamW step) and inference, at a (height, width) size, time per part and peak tensor memory.

The models' steps alternate (the order rotates every round) so that a busy machine slows both alike;
ratios are of the medians. Parts are timed by wrapping the models' own methods (backbone, neck,
RPN, RoI heads; decode and auxiliary heads), so a part's time includes its losses where the method
computes them (mmdet's ``rpn_head.loss_and_predict``, ``roi_head.loss``); backward and the
optimizer step are timed whole.
"""
import statistics
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import torch
from torch import nn

from ..tasks import task_of_model
from .catalogue import MODELS
from .measure import random_samples, tensor_peak_bytes

# the methods timed as parts: (attribute path, method), by model kind and mode
PARTS = {
    ('detector', 'train'): (('backbone', 'forward'), ('neck', 'forward'), ('rpn_head', 'loss_and_predict'),
                            ('roi_head', 'loss')),
    ('detector', 'infer'): (('backbone', 'forward'), ('neck', 'forward'), ('rpn_head', 'predict'),
                            ('roi_head', 'predict')),
    ('segmentor', 'train'): (('backbone', 'forward'), ('decode_head', 'loss'), ('auxiliary_head', 'loss')),
    ('segmentor', 'infer'): (('backbone', 'forward'), ('decode_head', 'predict')),
}


class PartTimer:
    """Seconds spent in named methods of a model during the current step."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    def wrap(self, owner: nn.Module, method: str, name: str) -> Callable[[], None]:
        """Time ``owner.method`` under ``name``; returns the function that restores the method."""
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        setattr(owner, method, timed)
        return lambda: delattr(owner, method)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time a block under ``name``."""
        start = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


class WholeModel:
    """One catalogue model (random weights) with its random batch, AdamW and step functions."""

    def __init__(self, name: str, size: Tuple[int, int], batch: int, instances: int = 7) -> None:
        from xcit_dense.builder import build_model
        torch.manual_seed(0)
        self.name, self.kind = name, MODELS[name]['kind']
        self.model = build_model(MODELS[name]['config'], {'model.backbone.init_cfg': None})
        self.params = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.05)
        self.timer = PartTimer()
        self.size, self.instances = size, instances
        self.rebatch(batch)

    def rebatch(self, batch: int) -> None:
        """Use a random batch of ``batch`` images (the same for every model, seeded)."""
        self.batch = batch
        self.inputs, self.samples = random_samples(task_of_model(self.model), batch, self.size, self.instances)

    def _parts(self, mode: str) -> List[Callable[[], None]]:
        restores = []
        for attr, method in PARTS[(self.kind, mode)]:
            owner = getattr(self.model, attr, None)
            if owner is not None:
                restores.append(self.timer.wrap(owner, method, attr))
        return restores

    def step(self, mode: str) -> Dict[str, float]:
        """One training step or inference; seconds in all (``total``) and per part."""
        self.timer.seconds = {}
        restores = self._parts(mode)
        start = time.perf_counter()
        try:
            if mode == 'infer':
                self.model.eval()
                with torch.no_grad():
                    self.model.predict(self.inputs, self.samples)
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
            for restore in restores:
                restore()
        return dict(self.timer.seconds, total=time.perf_counter() - start)

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
