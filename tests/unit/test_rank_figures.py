"""Every rank in the log: two ranks spawned on gloo train a small model under the toolkit's DDP
wrapper and hook (slow stage: they train); the log names the rank that computes slowest (with its
host), the one that holds the most memory, and warns once that a rank waits for its batches. The
step clock, the fetch timing and the comparisons in-process."""
import multiprocessing
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from mmengine.model import BaseModel
from torch import nn
from torch.utils.data import Dataset

import xcit_dense.engine.hooks  # noqa: F401  (registers the hooks and the DDP wrapper)
from xcit_dense.engine import step_clock
from xcit_dense.engine.hooks.rank_figures import FetchTimer, TimedBatches
from xcit_dense.engine.rank_stats import RankFigures, RanksSummary, reset_resident_peak, resident_peak_mb

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
        return dict(inputs=torch.full((8,), float(index % 4) / 4))


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


def _rank(rank: int, work_dir: str, rendezvous: str, results) -> None:
    """Rank 0 fetches slowly; rank 1 computes slowly and holds 128 MB in its forward."""
    import os

    from mmengine.runner import Runner
    os.environ['LOCAL_RANK'] = str(rank)  # (read by MMEngine's DDP wrapping; a CPU module takes no device)
    torch.distributed.init_process_group('gloo', init_method=f'file://{rendezvous}', rank=rank, world_size=2)
    try:
        runner = Runner(
            model=Line(sleep_s=0.25 * rank, hold_mb=128 * rank), work_dir=f'{work_dir}/rank{rank}',
            train_dataloader=dict(dataset=Vectors(fetch_s=0.2 * (rank == 0)), batch_size=2, num_workers=0,
                                  sampler=dict(type='DefaultSampler', shuffle=False)),
            train_cfg=dict(by_epoch=False, max_iters=ITERS), optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
            default_hooks=dict(logger=dict(type='LoggerHook', interval=INTERVAL), checkpoint=None,
                               rank_figures=dict(type='RankFiguresHook')),
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
    context = multiprocessing.get_context('spawn')
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, str(tmp / 'work'), str(tmp / 'rendezvous'), results))
             for r in range(2)]
    for process in ranks:
        process.start()
    try:
        logs = dict(results.get(timeout=300) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
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
    plot = subprocess.run([sys.executable, str(ROOT / 'tools/plot_logs.py'), str(two_rank_run / 'rank0'),
                           '--out', str(out)], capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    lines = plot.stdout.splitlines()
    # (no rank record taken for a validation metric: the run has no validation)
    assert lines[0] == f'{ITERS // INTERVAL} training records, {ITERS // INTERVAL} of every rank -> {out}'
    assert sorted(lines[1:]) == sorted([
        '  peak memory per rank: rank0, rank1', '  data wait per rank: rank0, rank1',
        "  own step time: slowest rank, the others' median",
        '  communication wait and network: wait rank0, wait rank1'])
    assert out.stat().st_size > 10_000


def figures(rank: int, own_step_s, data_wait: float = 0.0, memory_mb: float = 100.0) -> RankFigures:
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


@pytest.mark.quick
def test_own_step_times_start_at_a_step_and_end_at_its_first_bucket(monkeypatch):
    now = iter([10.0, 11.0, 20.0, 20.5, 30.0, 32.0, 40.0, 41.5])
    monkeypatch.setattr(step_clock.time, 'perf_counter', lambda: next(now))
    clock = step_clock.StepClock()
    clock.begin_step(), clock.bucket_ready()  # the run's first step (10 -> 11): not counted
    clock.begin_step(), clock.bucket_ready(), clock.bucket_ready()  # later buckets of a step change nothing
    assert clock.take() == [0.5] and clock.take() == []
    clock.begin_step(), clock.begin_step(), clock.bucket_ready()  # accumulation: two micro-batches, one step
    clock.begin_step(), clock.bucket_ready()
    assert clock.take() == [2.0, 1.5]


@pytest.mark.quick
def test_a_fetch_is_timed_and_the_iterator_keeps_its_attributes(monkeypatch):
    class Batches:
        epoch = 3

        def __next__(self):
            return 'batch'
    now = iter([1.0, 1.25, 2.0, 2.5])
    monkeypatch.setattr(time, 'perf_counter', lambda: next(now))
    timer = FetchTimer()
    batches = TimedBatches(Batches(), timer)
    assert [next(batches), next(batches)] == ['batch', 'batch'] and batches.epoch == 3
    assert timer.take() == 0.75 and timer.take() == 0.0


@pytest.mark.quick
def test_the_resident_peak_covers_the_interval():
    reset_resident_peak()
    before = resident_peak_mb()
    held = torch.ones(64 * 2 ** 18)  # 64 MB, touched
    assert resident_peak_mb() >= before + 60
    del held
    assert reset_resident_peak() and resident_peak_mb() < before + 30


@pytest.mark.quick
def test_an_epoch_loops_data_loader_times_its_batches_and_stays_what_it_was():
    from torch.utils.data import DataLoader

    from xcit_dense.engine.hooks.rank_figures import _time_loader, _untime_loader
    loader = DataLoader(Vectors(), batch_size=16)
    timer = FetchTimer()
    _time_loader(loader, timer)
    assert isinstance(loader, DataLoader) and len(loader) == 4 and loader.batch_size == 16
    batches = list(enumerate(loader))  # as MMEngine's epoch loop iterates
    assert len(batches) == 4 and timer.take() > 0
    _time_loader(loader, timer)  # a later epoch: timed once, not twice
    assert type(loader).__mro__[1] is DataLoader
    _untime_loader(loader)
    assert type(loader) is DataLoader
    list(loader)
    assert timer.take() == 0.0
