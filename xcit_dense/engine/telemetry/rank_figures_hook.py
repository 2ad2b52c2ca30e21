"""Every rank's memory, data wait and own step time in the log, the slow rank named.

Once per logger interval (when ``LoggerHook`` logs) each rank measures its figures
(``rank_stats.RankFigures``); the ranks gather them on the control group under the step bound,
and rank 0 logs a line naming the rank with the most memory, the one that waited longest for
batches, and the slowest rank beside the median of the others, with ``ranks/`` scalars for
curves (one value per interval, not averaged over the logger's window) and warnings
(``RanksSummary.warnings``), each kind at most once per log-processor window. At the end of
training, a table of each rank's figures over the run.

Data wait is the time spent inside the train loop's batch fetch, as the toolkit's loops time it
themselves (``loops.FetchClock``, the loop's ``fetch_clock``). A loop of another type (a config's
own, not run by ``ToolkitRunner``) has no such clock: the data wait is then not measured, said once in
the log and as "n/a" in the lines. Own step time and communication wait come from the DDP wrapper's
``step_clock`` (its start to the last gradient bucket ready; from there to the last all-reduce's
completion: host clocks on CPUs, CUDA events on GPUs, so both mean the same on either). The
communication wait is logged as a share of the rank's iterations (from the run's second on, fetches
included): the steps' waits over the iterations' time (``before_train_iter`` to this hook's
``after_train_iter``) plus the fetches. The network and GPU figures come from
``node_sampler.NodeSampler``'s thread.
Achieved FLOP/s and MFU: ``model_flops`` (the model counted once per run, by default on GPUs only,
where a device peak gives MFU; ``flops=True`` counts on CPUs too).
"""
import socket
import statistics
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Union

import torch
import torch.distributed as dist
from mmengine.dist import get_rank
from mmengine.hooks import Hook, LoggerHook
from mmengine.registry import HOOKS

from ..distributed.collectives import gather_objects
from ..distributed.process_group import begin_step_bound, end_step_bound, gpus_present, wait_bound_s, world_size
from .model_flops import COUNT_SHAPE, TrainingFlops, count_training_flops, is_mig, peak_tflops, training_dtype
from .node_sampler import NodeSampler, group_interface, open_rank_gpu
from .rank_stats import RankFigures, RanksSummary, peak_memory_mb, rate_text, reset_resident_peak

COUNT_TEXT = f'{COUNT_SHAPE[0]}x{COUNT_SHAPE[1]}'


@contextmanager
def _step_bound() -> Iterator[None]:
    """The step bound around the gathering, where the process groups have bounds (``dist``)."""
    if world_size() == 1 or wait_bound_s() <= 0:
        yield
        return
    begin_step_bound()
    try:
        yield
    finally:
        end_step_bound()


@HOOKS.register_module()
class RankFiguresHook(Hook):
    """Per-rank figures in the log once per logger interval (see the module).

    ``warn=False`` keeps the lines, the scalars and the run's table but not the threshold warnings: for
    runs whose ranks share a machine's cores by design (the demos' 2 processes on 2 CPU cores, with
    their data workers), where a waiting or slower rank is the setup, not a fault to look into.
    """

    # before LoggerHook (BELOW_NORMAL), whose log line resets CUDA's peak memory
    priority = 55

    def __init__(self, sample_period_s: float = 1.0, flops: Union[bool, str] = 'auto',
                 peak_tflops: Optional[float] = None, warn: bool = True) -> None:
        if flops not in (True, False, 'auto'):
            raise ValueError(f"RankFiguresHook: flops must be True, False or 'auto', got {flops!r}")
        if not isinstance(warn, bool):
            raise ValueError(f'RankFiguresHook: warn must be True or False, got {warn!r}')
        self._count_flops, self._peak_override, self._warn = flops, peak_tflops, warn
        self._fetch = None  # the train loop's FetchClock (None: a loop that does not time its fetches)
        self._warned: Dict[str, int] = {}
        self._run: List[RanksSummary] = []
        self._period_s = sample_period_s
        self._sampler: Optional[NodeSampler] = None
        self._since: Optional[float] = None  # the interval's start (training only)
        self._val_start: Optional[float] = None

    def before_train(self, runner) -> None:
        self._logger_hook = next((h for h in runner.hooks if isinstance(h, LoggerHook)), None)
        self._clock = getattr(runner.model, 'step_clock', None)
        self._device = torch.device('cuda', torch.cuda.current_device()) if gpus_present() else torch.device('cpu')
        self._host = socket.gethostname()
        self._warned.clear()
        self._run.clear()
        self._fetch = getattr(runner.train_loop, 'fetch_clock', None)
        if self._fetch is None:  # e.g. mmdet's or mmseg's own tools/train.py on the toolkit's configs:
            runner.logger.info(  # a normal run there, so a note rather than a warning
                f'data wait not measured: the train loop {type(runner.train_loop).__name__} does not time its batch '
                "fetches (the toolkit's ResumableEpochBasedTrainLoop and ResumableIterBasedTrainLoop do; "
                "ToolkitRunner runs MMEngine's loops as these)")
        else:
            self._fetch.take()
        if self._device.type == 'cpu':
            reset_resident_peak()
        interface = group_interface(dist.get_backend()) if world_size() > 1 else None
        self._sampler = NodeSampler(interface, open_rank_gpu(), self._period_s).start()
        self._iterations, self._steps_s = 0, 0.0
        self._flops, self._pixels, self._peak = self._model_flops(runner), [], None
        if self._flops is not None:
            dtype = training_dtype(runner.optim_wrapper)
            name, multiprocessors = 'CPU', None
            if self._device.type == 'cuda':
                properties = torch.cuda.get_device_properties(self._device)
                name, multiprocessors = properties.name, properties.multi_processor_count
            self._peak = self._peak_override or peak_tflops(name, dtype, multiprocessors=multiprocessors)
            peak = (f'{self._peak:g} TFLOP/s' if self._peak else
                    f"{'n/a (MIG)' if is_mig(name) else 'unknown'} (no MFU; RankFiguresHook peak_tflops sets it)")
            runner.logger.info(
                f'training FLOPs counted at {COUNT_TEXT}: {self._flops.per_pixel:.4g} per pixel and '
                f'{self._flops.per_image:.4g} per image (RoI heads); {dtype} peak of {name}: {peak}')
        self._since = time.perf_counter()

    def _model_flops(self, runner) -> Optional[TrainingFlops]:
        """The model's training FLOPs, counted now where asked to (None: not counted, said in the log)."""
        if self._count_flops is False or (self._count_flops == 'auto' and self._device.type != 'cuda'):
            return None
        model = getattr(runner.model, 'module', runner.model)
        try:
            return count_training_flops(model)
        except Exception as exc:  # a model the counter cannot trace: no FLOP figures, said once
            runner.logger.warning(f'achieved FLOP/s not measured: counting the model failed ({type(exc).__name__}: '
                                  f'{str(exc).splitlines()[0] if str(exc) else ""})')
            return None

    def before_val(self, runner) -> None:
        self._val_start = time.perf_counter()

    def after_val(self, runner) -> None:
        """A validation inside training is not part of the interval (its shares are of training time)."""
        if self._since is not None and self._val_start is not None:
            self._since += time.perf_counter() - self._val_start
        self._val_start = None

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._clock is not None:
            self._clock.begin_step()
        self._iter_start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._flops is not None and isinstance(data_batch, dict):
            self._pixels.extend(image_pixels(data_batch.get('inputs')))
        self._iterations += 1
        if self._iterations > 1:  # (the run's first step is not timed: see step_clock)
            self._steps_s += time.perf_counter() - self._iter_start
        if not self._logs_now(runner, batch_idx):
            return
        with _step_bound():
            summary = RanksSummary(gather_objects(self._measure()))
        self._since = time.perf_counter()
        if get_rank() != 0:
            return
        self._run.append(summary)
        runner.logger.info(f'ranks: {summary.line()}')
        runner.visualizer.add_scalars(summary.scalars(), step=runner.iter + 1)
        if not self._warn:
            return
        window = runner.log_processor.window_size
        window = window if isinstance(window, int) else self._logger_hook.interval
        workers = getattr(runner.train_dataloader, 'num_workers', 0)
        for kind, message in summary.warnings(workers).items():
            last = self._warned.get(kind)
            if last is None or runner.iter - last >= window:
                self._warned[kind] = runner.iter
                runner.logger.warning(message)

    def after_train(self, runner) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        if self._run and get_rank() == 0:
            runner.logger.info('per-rank figures of the run (over its logged intervals):\n' + run_table(self._run))

    def _logs_now(self, runner, batch_idx: int) -> bool:
        """Whether the logger writes its line after this iteration (the same answer on every rank)."""
        hook = self._logger_hook
        if hook is None:
            return False
        return hook.every_n_inner_iters(batch_idx, hook.interval) or (
            hook.end_of_epoch(runner.train_dataloader, batch_idx)
            and (not hook.ignore_last or len(runner.train_dataloader) <= hook.interval))

    def _measure(self) -> RankFigures:
        interval = max(time.perf_counter() - self._since, 1e-9)
        memory, reserved = peak_memory_mb(self._device)
        if self._device.type == 'cpu':
            reset_resident_peak()  # (CUDA's peak is reset by the logger's line)
        steps = self._clock.take() if self._clock is not None else []
        fetch_s = self._fetch.take() if self._fetch is not None else 0.0
        steps_s, self._steps_s = self._steps_s, 0.0
        own = [step.own_s for step in steps]
        comm_wait = (min(sum(step.wait_s for step in steps) / (steps_s + fetch_s), 1.0)
                     if steps and steps_s > 0 else None)
        tflops = None
        if self._flops is not None:
            tflops, self._pixels = self._flops.of(self._pixels) / interval / 1e12, []
        return RankFigures(rank=get_rank(), host=self._host, memory_mb=memory, reserved_mb=reserved,
                           data_wait=min(fetch_s / interval, 1.0) if self._fetch is not None else None,
                           own_step_s=statistics.fmean(own) if own else None,
                           interval_s=interval, comm_wait=comm_wait,
                           node=self._sampler.take() if self._sampler is not None else None,
                           tflops=tflops, mfu=tflops / self._peak if tflops is not None and self._peak else None)


def image_pixels(inputs) -> List[int]:
    """Each image's pixels in a batch's ``inputs`` (a list of C x H x W tensors, or one N x C x H x W)."""
    if isinstance(inputs, torch.Tensor):
        return [inputs.shape[-2] * inputs.shape[-1]] * (inputs.shape[0] if inputs.dim() == 4 else 1)
    return [image.shape[-2] * image.shape[-1] for image in inputs or [] if isinstance(image, torch.Tensor)]


def run_table(summaries: List[RanksSummary]) -> str:
    """A Markdown table of each rank over the run: peak memory, mean data wait, mean own step time,
    mean communication wait and, where counted, mean achieved FLOP/s and MFU."""
    rows = ['| rank | host | peak memory (MB) | data wait | own step (ms) | communication wait | achieved | MFU |',
            '|---|---|---|---|---|---|---|---|']
    by_rank: Dict[int, List[RankFigures]] = {}
    for summary in summaries:
        for figures in summary.figures:
            by_rank.setdefault(figures.rank, []).append(figures)
    for rank, figures in sorted(by_rank.items()):
        def mean(values: List[float], form: str) -> str:
            return format(statistics.fmean(values), form) if values else 'n/a'
        own = [f.own_step_s * 1e3 for f in figures if f.own_step_s is not None]
        comm = [f.comm_wait for f in figures if f.comm_wait is not None]
        tflops = [f.tflops for f in figures if f.tflops is not None]
        mfu = [f.mfu for f in figures if f.mfu is not None]
        data = [f.data_wait for f in figures if f.data_wait is not None]
        rows.append(f'| {rank} | {figures[0].host} | {max(f.memory_mb for f in figures):.0f} | '
                    f'{mean(data, ".1%")} | {mean(own, ".1f")} | {mean(comm, ".1%")} | '
                    f'{rate_text(statistics.fmean(tflops)) if tflops else "n/a"} | {mean(mfu, ".1%")} |')
    return '\n'.join(rows)
