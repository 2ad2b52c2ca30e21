"""A compile on one rank inside a training step extends the step bound on every rank
(``engine.distributed.compile_bound``): two real gloo ranks, forked, on one injected clock."""
import multiprocessing
import os
import queue
import threading
import time
import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as torch_dist
from helpers import free_port

from xcit_dense.engine.distributed import process_group as dist, wait_bounds as wait_bounds_module
from xcit_dense.engine.distributed.run_context import current_context
from xcit_dense.engine.training.compile import compile_forward

STEP_S, COMPILE_S = 1, 600


def _group_timeout() -> timedelta:
    return torch_dist.distributed_c10d._get_default_group()._get_backend(torch.device('cpu')).options._timeout


def _rank(rank: int, port: int, clock, moved, results) -> None:
    """One rank of a run that compiles: a step in which rank 1 compiles (a stand-in for a recompile:
    a real dynamo compile with the eager backend) while rank 0 waits in the step's all-reduce; then a
    step in which rank 1 stalls without compiling."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port), XCIT_STEP_TIMEOUT=str(STEP_S), XCIT_COMPILE_TIMEOUT=str(COMPILE_S))
    wait_bounds_module.time = types.SimpleNamespace(monotonic=lambda: clock.value)  # the step watch's clock
    with dist.process_group('pytorch'):  # as a run: an error of a collective waits for the watch's report
        _steps(rank, clock, moved, results)


def _steps(rank: int, clock, moved, results) -> None:
    compile_forward(torch.nn.Linear(1, 1))  # the run's compile path (nothing compiled until it is called)

    dist.begin_step_bound()  # a step after the first
    results.put((rank, 'timeout', _group_timeout().total_seconds()))
    if rank == 1:
        torch.compile(lambda x: x + 1, backend='eager')(torch.ones(1))
    work = torch_dist.all_reduce(torch.ones(1), async_op=True)  # rank 0 waits here while rank 1 compiles
    results.put((rank, 'in step 1', None))
    moved.wait(60)  # the parent moved the clock past the step bound
    for _ in range(1200):  # the watch has seen the bound pass (the clock is not real: no timing here)
        if current_context().watch.granted_s:
            break
        time.sleep(0.05)
    results.put((rank, 'granted', current_context().watch.granted_s))
    work.wait()
    dist.end_step_bound()

    dist.begin_step_bound()  # the next step: rank 1 stalls without compiling
    work = torch_dist.all_reduce(torch.ones(1), async_op=True) if rank == 0 else None
    results.put((rank, 'in step 2', None))
    if work is not None:
        work.wait()
    else:
        threading.Event().wait(120)
    os._exit(3)  # not reached: the step watch ends the process


@pytest.mark.slow  # two forked ranks: 5 s
def test_a_compile_on_one_rank_extends_the_step_bound_on_every_rank_and_a_stall_does_not(capfd):
    """Without the extension rank 0's watch ends the run in the first step, while rank 1 compiles; a
    watch that extended every step would not end the second."""
    context = multiprocessing.get_context('fork')  # two real ranks, this process's imports shared
    clock, moved, results = context.Value('d', 1000.0), context.Event(), context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(r, port, clock, moved, results)) for r in range(2)]
    for process in ranks:
        process.start()
    try:
        seen = {}

        def collect(what):  # both ranks' message `what` (the ranks run at their own pace)
            for _ in range(120):
                if sum(name == what for _, name in seen) == 2:
                    return {rank: seen[rank, what] for rank in range(2)}
                try:
                    rank, name, value = results.get(timeout=1)
                    seen[rank, name] = value
                except queue.Empty:
                    ended = {rank: process.exitcode for rank, process in enumerate(ranks) if not process.is_alive()}
                    assert not ended, f'ranks ended (rank: exit code) {ended} before {what!r}'
            pytest.fail(f'no {what!r} from both ranks within 120 s')

        # a collective issued in a step keeps the compile bound: it cannot be extended once issued
        assert collect('timeout') == {0: STEP_S + COMPILE_S, 1: STEP_S + COMPILE_S}
        collect('in step 1')
        clock.value += STEP_S + 1
        moved.set()
        assert collect('granted') == {0: COMPILE_S + 10, 1: COMPILE_S + 10}  # gloo's own error 10 s first
        collect('in step 2')
        clock.value += STEP_S + 1  # rank 1 stalls, without compiling
        for process in ranks:
            process.join(timeout=60)
        assert [process.exitcode for process in ranks] == [1, 1]
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
    err = capfd.readouterr().err
    for rank in range(2):
        assert (f'rank {rank}: rank(s) 1 compiled in this step (a first compile, or a recompile for a new input '
                f'size): its bound is extended by XCIT_COMPILE_TIMEOUT={COMPILE_S} s') in err, err[-3000:]
        assert (f'error: rank {rank} lost its peers: a training step has not finished within '
                f'XCIT_STEP_TIMEOUT={STEP_S} s;') in err, err[-3000:]
    assert 'XCIT_COMPILE_TIMEOUT=600 s (a rank compiled in it)' not in err

