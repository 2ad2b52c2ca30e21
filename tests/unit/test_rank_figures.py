"""Every rank in the log: two ranks spawned on gloo train a small model under the toolkit's DDP
wrapper, iteration loop and hook (slow stage: they train); the log names the rank that computes
slowest (with its host), the one that holds the most memory, and warns once that a rank waits for
its batches (as the loop times its fetches); the plot tool draws the run's panels. The step clock,
the loops' fetch timing and the comparisons in-process."""
import json
import socket
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import List, Optional

import matplotlib
import pytest
import torch
from helpers import ROOT, rank_processes, run_tool_in_process
from mmengine.model import BaseModel
from torch import nn
from torch.utils.data import Dataset

import xcit_dense.engine  # noqa: F401  (registers the hooks and the DDP wrapper)
from xcit_dense.engine.telemetry import step_clock
from xcit_dense.engine.telemetry.rank_stats import RankFigures, RanksSummary, reset_resident_peak, resident_peak_mb
from xcit_dense.engine.training import loops

ITERS, INTERVAL = 4, 2


class Vectors(Dataset):
    """Eight-element vectors; each fetch takes ``fetch_s`` when asked (a starved data pipeline)."""

    def __init__(self, fetch_s: float = 0.0) -> None:
        self.fetch_s = fetch_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict:
        if self.fetch_s:
            time.sleep(self.fetch_s)
        return dict(inputs=torch.full((1, 8), float(index % 4) / 4))  # (an "image" of 1 x 8 pixels)


class Line(BaseModel):
    """A linear model whose forward can sleep (a slow rank) and hold a large tensor (memory)."""

    def __init__(self, sleep_s: float = 0.0, hold_mb: int = 0) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.sleep_s, self.hold_mb = sleep_s, hold_mb

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        held = torch.ones(self.hold_mb * 2 ** 18) if self.hold_mb else None  # float32: 2**18 per MB
        loss = self.layer(torch.stack(inputs)).pow(2).mean()
        del held
        return dict(loss=loss)


# the training FLOPs of Line per input element ("pixel"), by hand: one multiply-add of the 8 x 1
# product, 2 FLOPs, times 3 forwards (forward and backward); the toolkit's counter counts detectors
# and segmentors only (its arithmetic is tested in test_model_flops)
LINE_FLOPS_PER_PIXEL = 2 * 3 * 1
PEAK_TFLOPS = 1e-9  # a peak set in the config (RankFiguresHook peak_tflops): CPUs have none in the table


def _rank(rank: int, work_dir: str, rendezvous: str, results) -> None:
    """Rank 0 fetches slowly; rank 1 computes slowly and holds 128 MB in its forward."""
    import os

    from mmengine.runner import Runner

    from xcit_dense.engine.telemetry import rank_figures_hook as rank_figures
    from xcit_dense.engine.telemetry.model_flops import TrainingFlops
    rank_figures.count_training_flops = lambda model: TrainingFlops(LINE_FLOPS_PER_PIXEL, 0.0)
    os.environ['LOCAL_RANK'] = str(rank)  # (read by MMEngine's DDP wrapping; a CPU module takes no device)
    torch.distributed.init_process_group('gloo', init_method=f'file://{rendezvous}', rank=rank, world_size=2)
    try:
        runner = Runner(
            model=Line(sleep_s=0.25 * rank, hold_mb=128 * rank), work_dir=f'{work_dir}/rank{rank}',
            train_dataloader=dict(dataset=Vectors(fetch_s=0.2 * (rank == 0)), batch_size=2, num_workers=0,
                                  sampler=dict(type='DefaultSampler', shuffle=False)),
            train_cfg=dict(type='ResumableIterBasedTrainLoop', max_iters=ITERS),  # (it times its fetches)
            optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
            default_hooks=dict(logger=dict(type='LoggerHook', interval=INTERVAL), checkpoint=None,
                               rank_figures=dict(type='RankFiguresHook', flops=True, peak_tflops=PEAK_TFLOPS)),
            log_processor=dict(window_size=10), cfg=dict(model_wrapper_cfg=dict(type='GradLayoutDDP', device_ids=None)),
            launcher='pytorch', default_scope='mmengine')
        runner.train()
        results.put((rank, 'trained'))
    except BaseException as exc:  # noqa: B902  (the parent must hear of any failure)
        results.put((rank, f'FAILED: {exc!r}'))
        raise
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope='module')
def two_rank_run(tmp_path_factory) -> Path:
    """The work dirs (rank0/, rank1/) of the two ranks' run."""
    tmp = tmp_path_factory.mktemp('ranks')
    # two real ranks, started fresh: a fork would inherit the threads and locks of whatever ran before in
    # this process (after an inductor compile of the slow stage, a forked rank hangs)
    logs = dict(rank_processes(_rank, lambda r: (r, str(tmp / 'work'), str(tmp / 'rendezvous'))))
    assert not any(text.startswith('FAILED') for text in logs.values()), logs
    return tmp / 'work'


@pytest.fixture(scope='module')
def two_rank_log(two_rank_run) -> str:
    """Rank 0's log of the run."""
    return next(two_rank_run.glob('rank0/*/*.log')).read_text()


@pytest.mark.slow
def test_the_slow_rank_is_named_with_its_host(two_rank_log):
    host = socket.gethostname()
    lines = [line for line in two_rank_log.splitlines() if 'ranks: 2 rank(s)' in line]
    assert len(lines) == ITERS // INTERVAL, two_rank_log
    for line in lines:  # (the run's first step is not timed: the first interval has its second)
        assert 'own step time slowest' in line and f'(rank 1, {host})' in line.split('own step time')[1], line
    assert f'rank 1, {host} is slow' in two_rank_log and f'rank 0, {host} is slow' not in two_rank_log


@pytest.mark.slow
def test_the_rank_holding_memory_is_named(two_rank_log):
    lines = [line for line in two_rank_log.splitlines() if 'ranks: 2 rank(s)' in line]
    assert all('resident (rank 1,' in line.split('data wait')[0] for line in lines), lines


@pytest.mark.slow
def test_a_slow_fetch_warns_once_naming_the_rank_and_num_workers(two_rank_log):
    warnings = [line for line in two_rank_log.splitlines() if 'waited for batches' in line]
    assert len(warnings) == 1, two_rank_log
    assert 'rank 0,' in warnings[0] and 'num_workers, now 0' in warnings[0]
    lines = [line for line in two_rank_log.splitlines() if 'ranks: 2 rank(s)' in line]
    assert all('data wait max' in line and '(rank 0,' in line.split('data wait max')[1] for line in lines)


@pytest.mark.slow
def test_the_plot_tool_draws_every_ranks_panels_from_the_runs_scalars(two_rank_run, tmp_path):
    out = tmp_path / 'curves.png'
    plot = subprocess.run([sys.executable, str(ROOT / 'tools/analysis_tools/plot_logs.py'), str(two_rank_run / 'rank0'),
                           '--out', str(out)], capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    lines = plot.stdout.splitlines()
    # (no rank record taken for a validation metric: the run has no validation)
    assert lines[0] == f'{ITERS // INTERVAL} training records, {ITERS // INTERVAL} of every rank -> {out}'
    assert sorted(lines[1:]) == sorted([
        '  peak memory per rank: rank0, rank1', '  data wait per rank: rank0, rank1',
        "  own step time: slowest rank, the others' median",
        '  communication wait per rank: rank0, rank1',
        '  achieved FLOP/s and MFU: TFLOP/s per rank, MFU'])
    assert out.stat().st_size > 10_000
    # the same run where the device's peak is unknown (as on CPUs without peak_tflops): FLOP/s only, said so
    scalars = next(two_rank_run.glob('rank0/*/vis_data/scalars.json'))
    records = [json.loads(line) for line in scalars.read_text().splitlines()]
    assert sum('ranks/mfu_mean' in record for record in records) == ITERS // INTERVAL
    unknown = tmp_path / 'unknown_peak' / 'scalars.json'
    unknown.parent.mkdir()
    unknown.write_text(''.join(json.dumps({k: v for k, v in record.items() if k != 'ranks/mfu_mean'}) + '\n'
                               for record in records))
    tool = str(ROOT / 'tools/analysis_tools/plot_logs.py')
    plot = subprocess.run([sys.executable, tool, str(unknown), '--out', str(out)],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert "  achieved FLOP/s and MFU: TFLOP/s per rank, (MFU n/a: the device's peak is unknown)" in plot.stdout


def svg_panels(svg: Path) -> dict:
    """{title: every text of its axes} of the axes drawn in a figure saved as SVG with its texts as text
    (svg.fonttype none): matplotlib writes an axes' title as its last text of its own (after the ticks)."""
    tag = '{http://www.w3.org/2000/svg}'
    panels = {}
    for group in ElementTree.parse(svg).iter(f'{tag}g'):
        own_texts = [child for child in group if child.get('id', '').startswith('text_')]
        if group.get('id', '').startswith('axes_') and own_texts:
            panels[''.join(own_texts[-1].itertext()).strip()] = [''.join(text.itertext()).strip()
                                                                 for text in group.iter(f'{tag}text')]
    return panels


def test_the_plot_draws_shares_and_rates_apart_and_leaves_out_what_a_cpu_run_did_not_log(tmp_path):
    """Two CPU ranks on one node: the communication wait (a share) on an axis of its own, not on the
    network's MB/s axis; no GPU utilisation or FLOP/s panel (nothing logged), no empty panel."""
    scalars = tmp_path / 'run' / '20261205_000000' / 'vis_data' / 'scalars.json'
    scalars.parent.mkdir(parents=True)
    records = []
    for step in (2, 4):
        records.append(dict(step=step, loss=1.0 / step, lr=0.01))
        records.append({'step': step, 'ranks/own_step_max_s': 0.2, 'ranks/own_step_others_median_s': 0.1,
                        **{f'ranks/{name}/rank{rank}': value for rank in (0, 1)
                           for name, value in (('memory_mb', 100.0), ('data_wait', 0.1), ('comm_wait', 0.3))},
                        'ranks/net_received_mb_s/node0': 50.0, 'ranks/net_sent_mb_s/node0': 40.0})
    scalars.write_text(''.join(json.dumps(record) + '\n' for record in records))
    with matplotlib.rc_context({'svg.fonttype': 'none'}):
        proc = run_tool_in_process('tools/analysis_tools/plot_logs.py', tmp_path / 'run', '--out',
                                   tmp_path / 'curves.svg',
                                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    panels = svg_panels(tmp_path / 'curves.svg')
    assert set(panels) == {'training loss', 'learning rate', 'validation', 'peak memory per rank',
                           'data wait per rank', 'own step time', 'communication wait per rank', 'network per node'}
    wait, network = panels['communication wait per rank'], panels['network per node']
    assert {'share of the interval', 'rank0', 'rank1'} <= set(wait) and not any('MB/s' in t for t in wait)
    assert {'MB/s', 'in node0', 'out node0'} <= set(network)
    assert '  communication wait per rank: rank0, rank1' in proc.stdout.splitlines()


def figures(rank: int, own_step_s, data_wait: Optional[float] = 0.0, memory_mb: float = 100.0) -> RankFigures:
    return RankFigures(rank=rank, host=f'node{rank // 2}', memory_mb=memory_mb, reserved_mb=None,
                       data_wait=data_wait, own_step_s=own_step_s, interval_s=10.0)


@pytest.mark.quick
def test_the_slow_rank_is_compared_with_the_median_of_the_others():
    summary = RanksSummary([figures(0, 0.100), figures(1, 0.104), figures(2, 0.500), figures(3, 0.110)])
    slow, median = summary.slowest()
    assert (slow.rank, median) == (2, 0.104)
    assert 'rank 2, node1 is slow' in summary.warnings(4)['slow_rank']
    assert summary.scalars()['ranks/own_step_max_rank'] == 2
    even = RanksSummary([figures(0, 0.100), figures(1, 0.114), figures(2, None)])  # within 15%
    assert 'slow_rank' not in even.warnings(4) and even.slowest()[0].rank == 1
    assert RanksSummary([figures(0, 0.1), figures(1, None)]).slowest() is None


class Bucket:
    """A stand-in for DDP's GradBucket: the clock reads only whether it is the step's last."""

    def __init__(self, last: bool) -> None:
        self.last = last

    def is_last(self) -> bool:
        return self.last


@pytest.mark.quick
def test_own_step_ends_at_the_last_bucket_and_the_wait_at_the_latest_completion(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(step_clock.time, 'perf_counter', lambda: now[0])
    clock = step_clock.StepClock(torch.device('cpu'))

    def at(t: float, action):
        now[0] = t
        return action()

    def bucket(t: float, last: bool) -> torch.futures.Future:
        future = torch.futures.Future()
        watched = at(t, lambda: clock.watch(clock.bucket_ready(Bucket(last)), future))
        return future, watched

    at(0.0, clock.begin_step)  # the run's first step (not counted)
    first, _ = bucket(1.0, last=True)
    at(1.5, lambda: first.set_result(torch.ones(1)))
    at(10.0, clock.begin_step)
    early, _ = bucket(10.5, last=False)  # an earlier bucket changes nothing of the own time
    last, watched = bucket(12.0, last=True)
    at(12.25, lambda: last.set_result(torch.full((1,), 2.0)))
    at(13.0, lambda: early.set_result(torch.ones(1)))  # completions in no fixed order (gloo): the latest counts
    assert watched.wait().item() == 2.0  # the all-reduce's value passes through
    at(20.0, clock.begin_step), at(21.0, clock.begin_step)  # accumulation: two micro-batches, one step
    only, _ = bucket(23.0, last=True)
    at(23.5, lambda: only.set_result(torch.ones(1)))
    assert clock.take() == [step_clock.StepTime(2.0, 1.0), step_clock.StepTime(3.0, 0.5)]
    assert clock.take() == []


class SleepInBackward(torch.autograd.Function):
    """The identity, whose backward sleeps: a rank computing slowly after its first gradient bucket."""

    @staticmethod
    def forward(ctx, x, sleep_s: float):
        ctx.sleep_s = sleep_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.sleep_s)
        return grad, None


class TwoBuckets(nn.Module):
    """Two 4 MB layers, one gradient bucket each (1 MB buckets): the second layer's gradient is the
    first bucket, then the backward sleeps ``sleep_s``, then the first layer's is the last bucket."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.first, self.second, self.sleep_s = nn.Linear(1024, 1024), nn.Linear(1024, 1024), sleep_s

    def forward(self, x):
        return self.second(SleepInBackward.apply(self.first(x), self.sleep_s))


def _timed_rank(rank: int, rendezvous: str, results) -> None:
    """Rank 1 sleeps 0.5 s in its backward after its first bucket; then both ranks run a hook that sleeps
    50 ms after the clock noted the last bucket ready, before launching its all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    torch.distributed.init_process_group('gloo', init_method=f'file://{rendezvous}', rank=rank, world_size=2)
    try:
        def steps(ddp, clock: step_clock.StepClock) -> List[step_clock.StepTime]:
            for _ in range(4):
                clock.begin_step()
                ddp(torch.ones(8, 1024)).sum().backward()
            return clock.take()

        slow_backward = DistributedDataParallel(TwoBuckets(0.5 * rank), bucket_cap_mb=1)
        slow = steps(slow_backward, step_clock.time_steps(slow_backward))
        clock = step_clock.StepClock(torch.device('cpu'))

        def sleepy_allreduce(group, bucket):
            step = clock.bucket_ready(bucket)
            if bucket.is_last():
                time.sleep(0.05)
            return clock.watch(step, allreduce_hook(group, bucket))
        sleepy_hook = DistributedDataParallel(TwoBuckets(0.0), bucket_cap_mb=1)
        sleepy_hook.register_comm_hook(None, sleepy_allreduce)
        results.put((rank, dict(slow=slow, sleepy=steps(sleepy_hook, clock))))
    except BaseException as exc:  # noqa: B902  (the parent must hear of any failure)
        results.put((rank, f'FAILED: {exc!r}'))
        raise
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_rank_slow_after_its_first_bucket_is_slowest_and_its_peer_waits_for_it(tmp_path):
    """Two gloo ranks: the 0.5 s rank 1 computes after its first bucket is its own step time (it is named
    slowest), and rank 0 spends it waiting in the all-reduce; a hook that sleeps 50 ms after noting its
    last bucket shows that time as communication wait on both ranks, not as own step time."""
    times = dict(rank_processes(_timed_rank, lambda r: (r, str(tmp_path / 'rendezvous')), timeout=120))
    assert not any(isinstance(t, str) for t in times.values()), times
    slow = {rank: t['slow'] for rank, t in times.items()}
    assert all(len(steps) == 3 for steps in slow.values()), slow  # 4 steps, the first not counted
    # (differences, not absolute times: the machine may be loaded)
    assert all(s.own_s >= 0.5 for s in slow[1]), slow
    assert all(one.own_s - zero.own_s >= 0.3 and zero.wait_s - one.wait_s >= 0.3
               for zero, one in zip(slow[0], slow[1])), slow
    summary = RanksSummary([RankFigures(rank=rank, host='node0', memory_mb=1.0, reserved_mb=None, data_wait=0.0,
                                        own_step_s=statistics.fmean(s.own_s for s in steps), interval_s=1.0)
                            for rank, steps in sorted(slow.items())])
    assert summary.slowest()[0].rank == 1
    sleepy = [s for t in times.values() for s in t['sleepy']]
    assert len(sleepy) == 6 and all(s.wait_s >= 0.05 for s in sleepy), sleepy


@pytest.fixture
def half_second_clock(monkeypatch):
    """perf_counter advancing 0.5 s a reading: each timed fetch takes 0.5 s."""
    now = iter(0.5 * i for i in range(1000))
    monkeypatch.setattr(loops.time, 'perf_counter', lambda: next(now))


def uninterrupted(fetch):
    """In place of the loops' ``InterruptibleFetch`` (no signal comes in these tests)."""
    return fetch()


@pytest.mark.quick
def test_the_iteration_loops_batches_time_each_fetch(half_second_clock):
    from torch.utils.data import DataLoader
    clock = loops.FetchClock()
    batches = loops._EndlessBatches(DataLoader(Vectors(), batch_size=32), False, lambda: None, clock, uninterrupted)
    batches.ignore = 1
    assert next(batches) is None and clock.take() == 0.0  # MMEngine's resume skip loads nothing
    assert [next(batches)['inputs'].shape[0] for _ in range(3)] == [32, 32, 32]  # the second pass begins
    assert batches.epoch == 1 and clock.take() == 1.5 and clock.take() == 0.0


@pytest.mark.quick
def test_the_epoch_loops_pass_times_its_start_and_batches_and_is_the_data_loader(half_second_clock):
    from torch.utils.data import DataLoader
    clock = loops.FetchClock()
    loader = DataLoader(Vectors(), batch_size=16)
    epoch = loops._EpochPass(loader, 0, False, lambda: None, clock, uninterrupted)
    assert len(epoch) == 4 and epoch.batch_size == 16
    epoch._iterator = 'set by a hook'  # (as mmdet's PipelineSwitchHook restarts persistent workers)
    assert loader._iterator == 'set by a hook'
    loader._iterator = None
    assert len(list(enumerate(epoch))) == 4  # as MMEngine's epoch loop iterates
    assert clock.take() == 0.5 * 6  # the pass's start, four batches and the end of the pass
    reached = []
    resumed = loops._EpochPass(loader, 3, False, lambda: reached.append(True), clock, uninterrupted)
    assert len(list(resumed)) == 1 and reached == [True]
    assert clock.take() == 0.5 * 3  # the start (three batches loaded and dropped), one batch, the end


@pytest.mark.quick
def test_data_wait_not_timed_by_the_loop_is_na_not_zero():
    untimed = RanksSummary([figures(0, 0.1, data_wait=None), figures(1, 0.1, data_wait=None)])
    assert 'data wait n/a' in untimed.line() and untimed.most_data_wait is None
    assert not any(key.startswith('ranks/data_wait') for key in untimed.scalars())
    assert 'data_wait' not in untimed.warnings(0)


@pytest.mark.quick
def test_the_resident_peak_covers_the_interval():
    reset_resident_peak()
    before = resident_peak_mb()
    held = torch.ones(64 * 2 ** 18)  # 64 MB, touched
    assert resident_peak_mb() >= before + 60
    del held
    assert reset_resident_peak() and resident_peak_mb() < before + 30


@pytest.mark.quick
def test_warn_takes_true_or_false():
    from xcit_dense.engine.telemetry.rank_figures_hook import RankFiguresHook
    RankFiguresHook(warn=False)
    with pytest.raises(ValueError, match='warn must be True or False'):
        RankFiguresHook(warn='off')  # a string would read as true and keep the warnings
