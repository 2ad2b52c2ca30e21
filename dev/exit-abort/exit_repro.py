"""Minimal reproducer of the exit abort (dev/exit-abort.md), run under torchrun with 2 processes:

  torchrun --nproc_per_node=2 dev/exit-abort/exit_repro.py [--before-fix] [--starve] [--fail-rank R]

What a training run does at its end, and nothing else: a DDP model held by a Runner-like object
in a reference cycle (so only a garbage collection frees it, and with it the process group), one
training step, then the collective an mmengine evaluator ends with (``broadcast_object_list``,
as in ``BaseMetric.evaluate``), and a heap whose final garbage collection lasts as long as an
mmdet process's. ``--before-fix`` sets the group up as the toolkit did before the fix
(``init_process_group``, ``destroy_process_group`` in an ``atexit`` handler); by default it comes
from ``xcit_dense.engine.process_group``. ``--starve`` lowers the group's work threads to nice 19,
as a loaded machine may leave them unscheduled (run busy loops beside). ``--fail-rank R`` makes rank
R raise before the last collective (the error path). ``dev/exit-abort/stress_exit.py minimal`` runs it many
times and counts the aborts.
"""
import argparse
import atexit
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from xcit_dense.engine.distributed.process_group import gloo_worker_threads, process_group

HEAP: list = []  # freed while the interpreter finalises


def evaluate_once(fail_rank: int, starve: bool) -> None:
    runner = {'model': torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))}
    runner['self'] = runner  # like mmengine's Runner: garbage that only a collection frees
    if starve:  # the group's work threads exist now
        for tid in gloo_worker_threads():
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    runner['model'](torch.randn(2, 4)).sum().backward()
    if dist.get_rank() == fail_rank:
        raise RuntimeError(f'rank {fail_rank} failed on purpose')
    metrics = [{'mAP': 0.5}] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--before-fix', action='store_true')
    parser.add_argument('--starve', action='store_true')
    parser.add_argument('--fail-rank', type=int, default=-1)
    parser.add_argument('--heap', type=int, default=2_000_000, help='Python objects alive at exit')
    args = parser.parse_args()
    HEAP.extend([i] for i in range(args.heap))
    if args.before_fix:
        dist.init_process_group('gloo', timeout=timedelta(seconds=60))
        atexit.register(dist.destroy_process_group)
        evaluate_once(args.fail_rank, args.starve)
        return
    with process_group('pytorch'):
        evaluate_once(args.fail_rank, args.starve)
    print(f'process group left; gloo threads alive: {len(gloo_worker_threads())}', flush=True)


if __name__ == '__main__':
    main()
