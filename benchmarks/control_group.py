"""The toolkit's gloo control group: its set-up time and the per-step agreement's time, by world size.

Each process runs on a host of its own: a Linux network namespace with its own interface and
address, joined to the others by a bridge (tests/support/netns.py, as the cluster tests use; root
needed). Every process joins a gloo main group, then times:

- set-up: ``dist.new_group(backend='gloo')``, the control group as ``engine.distributed.collectives`` creates
  it, eager (a full TCP mesh: N-1 connections per rank) and with ``TORCH_GLOO_LAZY_INIT=1``
  (connections made at first use), and for lazy also the first agreement, which pays them;
- per step: ``collectives.agree_on_max`` on two numbers, what every optimizer step makes
  (``step_agreement``), timed over many calls after a warm-up.

Set-up is the slowest rank's; per-step figures are the slowest rank's median and 90th percentile.
On a small machine the processes share the cores: the figures then measure CPU contention as
much as the network (the table prints the machine's load beside them).

Usage: sudo python benchmarks/control_group.py [--worlds 2 4 8] [--steps 300]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
PORT = 29611


def worker(args: argparse.Namespace) -> None:
    """One rank: join, time the control group's set-up and the agreements, write the figures."""
    os.environ.update(MASTER_ADDR=args.master, MASTER_PORT=str(PORT), RANK=str(args.rank),
                      WORLD_SIZE=str(args.world), GLOO_SOCKET_IFNAME='eth0')
    from datetime import timedelta

    import torch.distributed as dist

    from xcit_dense.engine.distributed import collectives

    dist.init_process_group('gloo', timeout=timedelta(seconds=300))
    figures: Dict[str, object] = {}
    for mode in ('eager', 'lazy'):
        if mode == 'lazy':
            os.environ['TORCH_GLOO_LAZY_INIT'] = '1'
        dist.barrier()
        start = time.perf_counter()
        group = dist.new_group(backend='gloo', timeout=timedelta(seconds=300))
        figures[f'{mode}_setup_s'] = time.perf_counter() - start
        collectives._SIDE_GROUP = group  # the agreements run on it, as on an NCCL run
        dist.barrier()
        start = time.perf_counter()
        collectives.agree_on_max([0.0, 0.0])
        figures[f'{mode}_first_s'] = time.perf_counter() - start
        for _ in range(20):  # warm-up
            collectives.agree_on_max([0.0, 0.0])
        times: List[float] = []
        for _ in range(args.steps):
            start = time.perf_counter()
            collectives.agree_on_max([float(args.rank), 0.0])
            times.append(time.perf_counter() - start)
        figures[f'{mode}_step_ms'] = [t * 1000 for t in times]
        collectives._SIDE_GROUP = None
        os.environ.pop('TORCH_GLOO_LAZY_INIT', None)
    dist.barrier()
    Path(args.out).write_text(json.dumps(figures))
    dist.destroy_process_group()


def measure(world: int, steps: int) -> Dict[str, float]:
    """Start ``world`` processes on as many namespace hosts; the slowest rank's figures."""
    sys.path.insert(0, str(ROOT / 'tests' / 'support'))
    import netns

    reason = netns.missing_reason()
    if reason:
        sys.exit(f'error: {reason}')
    with netns.private_hosts(world) as net, tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank, host in enumerate(net.hosts):
            cmd = net.command(host, [sys.executable, __file__, '--worker', '--rank', str(rank), '--world', str(world),
                                     '--master', net.hosts[0].address, '--steps', str(steps),
                                     '--out', f'{tmp}/rank{rank}.json'])
            procs.append(subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))))
        try:
            for proc in procs:
                if proc.wait(timeout=900) != 0:
                    sys.exit(f'error: a worker of the {world}-process run failed')
        finally:
            for proc in procs:
                proc.kill()
        ranks = [json.loads(Path(f'{tmp}/rank{r}.json').read_text()) for r in range(world)]
    result: Dict[str, float] = {}
    for mode in ('eager', 'lazy'):
        result[f'{mode}_setup_s'] = max(r[f'{mode}_setup_s'] for r in ranks)
        result[f'{mode}_first_s'] = max(r[f'{mode}_first_s'] for r in ranks)
        result[f'{mode}_median_ms'] = max(statistics.median(r[f'{mode}_step_ms']) for r in ranks)
        result[f'{mode}_p90_ms'] = max(statistics.quantiles(r[f'{mode}_step_ms'], n=10)[-1] for r in ranks)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--worlds', type=int, nargs='+', default=[2, 4, 8])
    parser.add_argument('--steps', type=int, default=300)
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--rank', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--world', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--master', help=argparse.SUPPRESS)
    parser.add_argument('--out', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f'{os.cpu_count()} CPU cores; load average before: {" ".join(f"{x:.2f}" for x in os.getloadavg())}')
    print('| processes | set-up eager (s) | set-up lazy (s) | first agreement lazy (s) | '
          'agreement eager median / p90 (ms) | agreement lazy median / p90 (ms) |')
    print('|---|---|---|---|---|---|')
    for world in args.worlds:
        r = measure(world, args.steps)
        print(f"| {world} | {r['eager_setup_s']:.3f} | {r['lazy_setup_s']:.3f} | {r['lazy_first_s']:.3f} | "
              f"{r['eager_median_ms']:.2f} / {r['eager_p90_ms']:.2f} | "
              f"{r['lazy_median_ms']:.2f} / {r['lazy_p90_ms']:.2f} |", flush=True)
    print(f'load average after: {" ".join(f"{x:.2f}" for x in os.getloadavg())}')


if __name__ == '__main__':
    main()
