"""The toolkit's own cost per training iteration: iteration times read from MMEngine's json log,
each hook's own time per iteration and the per-step collectives' time, timed inside the run.

``install()`` runs in the training process (``python -m benchmarks overhead`` puts a ``sitecustomize``
that calls it on the child's path, so that tools/train.py and tools/dist_train.sh run unchanged):
it wraps ``Runner.call_hook`` to time each hook's ``before_train_iter``/``after_train_iter`` and
the collectives of xcit_dense.engine (``agree_on_max`` behind the step agreement, ``gather_objects``),
notes the moment each iteration ends (after its ``after_train_iter`` hooks: every iteration's time,
whatever the logger's interval), and writes them to ``$XCIT_OVERHEAD_OUT.<rank>.json`` at exit.
"""
import atexit
import json
import math
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ITER_FNS = ('before_train_iter', 'after_train_iter')


def read_iteration_times(work_dir: str, skip: int) -> List[float]:
    """Per-iteration ``time`` of the newest json log (scalars.json) under ``work_dir``, the first
    ``skip`` training iterations left out. Needs ``default_hooks.logger.interval=1`` and
    ``log_processor.window_size=1`` for one value per iteration."""
    logs = sorted(Path(work_dir).glob('*/vis_data/scalars.json'))
    if not logs:
        raise FileNotFoundError(f'no */vis_data/scalars.json under {work_dir}')
    times = []
    for line in logs[-1].read_text().splitlines():
        record = json.loads(line)
        if 'time' in record and 'iter' in record and record['iter'] > skip and 'loss' in record:
            times.append(float(record['time']))
    return times


def stamped_iteration_times(report: dict, skip: int) -> List[float]:
    """Each iteration's time from an ``install()`` report's end-of-iteration moments, the first
    ``skip`` iterations left out (the first iteration has no start moment: always left out)."""
    stamps = report['ends']
    return [end - start for start, end in zip(stamps[max(skip, 1) - 1:], stamps[max(skip, 1):])]


def relative_cost(on: Sequence[float], off: Sequence[float]) -> float:
    """(median on - median off) / median off: the share of an iteration that a thing costs."""
    return statistics.median(on) / statistics.median(off) - 1.0


def workers_per_gpu(images_per_step: float, step_s: float, images_per_s_per_worker: float,
                    margin: float = 1.0) -> int:
    """Data-loader workers that deliver ``images_per_step`` every ``step_s`` seconds (times ``margin``)."""
    if images_per_step <= 0 or step_s <= 0 or images_per_s_per_worker <= 0 or margin <= 0:
        raise ValueError('images per step, step time, worker rate and margin must be positive')
    return max(1, math.ceil(margin * images_per_step / step_s / images_per_s_per_worker - 1e-9))


# ----------------------------------------------------------------- inside the training process
_TOTALS: Dict[str, float] = defaultdict(float)
_CALLS: Dict[str, int] = defaultdict(int)
_ITERS = [0]
_ENDS: List[float] = []


def _timed(key: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _TOTALS[key] += time.perf_counter() - start
            _CALLS[key] += 1
    return wrapper


def install(out: Optional[str] = None) -> None:
    """Time the hooks' per-iteration calls and the toolkit's collectives in this process."""
    out = out or os.environ.get('XCIT_OVERHEAD_OUT')
    if not out:
        return
    from mmengine.runner import Runner

    from xcit_dense.engine.distributed import collectives
    from xcit_dense.engine.training import rng_state_hook as rng_state, step_agreement

    step_agreement.agree_on_max = _timed('collective/agree_on_max (step agreement)',
                                         step_agreement.agree_on_max)
    rng_state.gather_objects = _timed('collective/gather_objects (RNG states)',
                                      rng_state.gather_objects)
    collectives.barrier_within = _timed('collective/barrier_within (exit)', collectives.barrier_within)

    def call_hook(self, fn_name: str, **kwargs) -> None:
        if fn_name not in ITER_FNS:
            return original(self, fn_name, **kwargs)
        if fn_name == 'after_train_iter':
            _ITERS[0] += 1
        for hook in self._hooks:
            method = getattr(hook, fn_name, None)
            if method is None:
                continue
            start = time.perf_counter()
            method(self, **kwargs)
            key = f'hook/{type(hook).__name__}'
            _TOTALS[key] += time.perf_counter() - start
            _CALLS[key] += 1
        if fn_name == 'after_train_iter':
            _ENDS.append(time.perf_counter())

    original = Runner.call_hook
    Runner.call_hook = call_hook

    def write() -> None:
        rank = os.environ.get('RANK', f'pid{os.getpid()}')  # a launcher without RANK: its own file
        Path(f'{out}.{rank}.json').write_text(json.dumps(
            dict(iterations=_ITERS[0], totals=dict(_TOTALS), calls=dict(_CALLS), ends=_ENDS)))

    atexit.register(write)


def per_iteration(report: dict) -> Dict[str, float]:
    """Seconds per training iteration of each timed thing in one ``install()`` report."""
    iters = max(report['iterations'], 1)
    return {key: total / iters for key, total in sorted(report['totals'].items())}
