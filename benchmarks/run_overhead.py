"""The toolkit's own overhead per training iteration, on the demo config (issue 24):

1. tools/train.py against mmdet's own tools/train.py, one process, runs alternated;
2. the toolkit's hooks (configs/_base_/toolkit_hooks.py) all on against all off
   (``--cfg-options default_hooks.<name>=None``), runs alternated, and each hook's own time per
   iteration, timed inside the "on" runs;
3. at 2 processes (tools/dist_train.sh, gloo on CPU) the toolkit's per-step collectives
   (xcit_dense/engine/distributed/collectives.py, step_agreement.py), timed inside the run;
4. at 2 processes, every rank's figures (RankFiguresHook: the gathering, the sampler thread, the
   timing) on against off (``default_hooks.rank_figures=None``), runs alternated, at each logger
   interval of ``--ranks-intervals`` (the hook gathers once per interval): 1, an upper bound, and
   the configs' 50. At an interval over 1 the cost is paid in one iteration of the interval, so the
   runs are compared by their mean iteration time (the median would not see it), and the hook's own
   time per iteration, timed inside the "on" runs, is given beside it. (DDP's timed communication
   hook and the loops' fetch timing stay on in both: they always are.)

Iteration times are read from each run's json log (``time``, logger interval 1) or, at other
intervals, from the moments each iteration ended, noted inside the run (``benchmarks.overhead``);
the first ``--skip`` iterations left out. The machine's load average is printed with every run: compare the
ratios of alternated runs, not absolute times, on a busy machine.
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
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.overhead import (  # noqa: E402
    per_iteration,
    read_iteration_times,
    relative_cost,
    stamped_iteration_times,
)

CONFIG = 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py'
SITECUSTOMIZE = 'from benchmarks.overhead import install\ninstall()\n'


def mmdet_train_tool() -> str:
    import mmdet
    return str(Path(mmdet.__file__).parent / '.mim' / 'tools' / 'train.py')


def run(label: str, argv: list, work_dir: Path, args, env_extra: dict) -> dict:
    """One training run; returns its iteration times' median and mean, in-process report and the load
    average. ``env_extra['interval']``: the logger's interval (default 1)."""
    world = args.procs if label.startswith('dist') else 1
    interval = env_extra.pop('interval', 1)
    options = ['train_cfg.max_epochs=1', f'default_hooks.logger.interval={interval}', 'log_processor.window_size=1',
               f'train_dataloader.batch_size={args.batch_size}',
               f'train_dataloader.dataset.indices={args.iters * args.batch_size * world}']
    options += env_extra.pop('options', [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(args.site), str(ROOT)] + ([os.environ['PYTHONPATH']] if os.environ.get('PYTHONPATH') else [])),
        XCIT_OVERHEAD_OUT=str(work_dir / 'overhead'), **env_extra)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    command = argv + ['--work-dir', str(work_dir), '--cfg-options'] + options
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode:
        sys.exit(f'{label} failed ({done.returncode}):\n{done.stdout[-3000:]}')
    reports = [json.loads(p.read_text()) for p in sorted(work_dir.glob('overhead.*.json'))]
    reports = [r for r in reports if r['iterations']]  # the launcher's own report has none (rank 0's first)
    times = (read_iteration_times(str(work_dir), args.skip) if interval == 1
             else stamped_iteration_times(reports[0], args.skip))
    result = dict(label=label, median=statistics.median(times), mean=statistics.fmean(times), n=len(times), load=load,
                  load_after=os.getloadavg()[0], wall=time.perf_counter() - start,
                  parts=[per_iteration(r) for r in reports])
    print(f'  {label:<22} median {result["median"]:.3f} s/iter, mean {result["mean"]:.3f}, {len(times)} iterations, '
          f'load {load:.2f} -> {result["load_after"]:.2f}', flush=True)
    return result


def _allreduce_worker(rank: int, port: int, calls: int, queue) -> None:
    """One of 2 gloo processes: time ``agree_on_max`` right after a barrier (its own latency)."""
    import torch.distributed as dist

    from xcit_dense.engine.distributed.collectives import agree_on_max, barrier_within
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=2)
    times = []
    for _ in range(calls):
        barrier_within(60.0)
        start = time.perf_counter()
        agree_on_max([0.0, 0.0])
        times.append(time.perf_counter() - start)
    if rank == 0:
        queue.put(times[20:])
    dist.destroy_process_group()


def allreduce_latency(calls: int = 300) -> list:
    """``agree_on_max``'s own latency between 2 gloo processes, without the ranks' skew."""
    import torch.multiprocessing as mp
    context = mp.get_context('spawn')
    queue = context.SimpleQueue()
    mp.start_processes(_allreduce_worker, args=(29900 + os.getpid() % 90, calls, queue), nprocs=2,
                       start_method='spawn')
    return queue.get()


def table(rows, header):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def ranks_cost(args: argparse.Namespace, interval: int, wd) -> list:
    """Every rank's figures on against off at ``args.procs`` processes, gathered every ``interval``
    iterations, ``args.pairs`` alternated pairs: the report's lines."""
    print(f'every rank\'s figures on against off ({args.procs} processes, logger interval {interval}):')
    dist = ['bash', 'tools/dist_train.sh', args.config, str(args.procs)]
    statistic = 'median' if interval == 1 else 'mean'  # (a cost paid once per interval: in the mean only)
    rows, costs, hook = [], [], []
    for pair in range(args.pairs):
        sides = [('dist figures on', []), ('dist figures off', ['default_hooks.rank_figures=None'])]
        if pair % 2:
            sides.reverse()
        res = {name: run(name, dist, wd(name.replace(' ', '_')), args,
                         dict(options=list(opts), interval=interval, PORT=str(29600 + (os.getpid() + pair) % 300)))
               for name, opts in sides}
        on, off = res['dist figures on'], res['dist figures off']
        costs.append(relative_cost([on[statistic]], [off[statistic]]))
        own = max(part.get('hook/RankFiguresHook', 0.0) for part in on['parts'])  # (the slower rank's)
        hook.append(own / on[statistic])
        rows.append([pair + 1, f'{on[statistic]:.3f}', f'{off[statistic]:.3f}', f'{100 * costs[-1]:+.2f} %',
                     f'{1e3 * own:.2f} ms ({100 * hook[-1]:.3f} %)', f'{on["load"]:.1f} / {off["load"]:.1f}'])
    spread = f', spread (max - min) {100 * (max(costs) - min(costs)):.2f} points' if len(costs) > 1 else ''
    every = 'every iteration' if interval == 1 else f'every {interval} iterations'
    return [f'### every rank\'s figures on against off, {args.procs} processes, a gathering {every} '
            f'(median of the pairs {100 * statistics.median(costs):+.2f} %{spread}; the hook\'s own time '
            f'{100 * statistics.median(hook):.3f} % of an iteration)', '',
            table(rows, ['pair', f'on s/iter ({statistic})', f'off s/iter ({statistic})', 'on/off - 1',
                         'hook\'s own time per iteration (share)', 'load avg (on / off)']), '']


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m benchmarks overhead', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--pairs', type=int, default=1, help='alternated pairs per comparison')
    parser.add_argument('--iters', type=int, default=10, help='training iterations per run (per process)')
    parser.add_argument('--skip', type=int, default=2, help='first iterations left out')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--procs', type=int, default=2, help='processes of the collectives run (0: none)')
    parser.add_argument('--parts', nargs='+', default=['tools', 'hooks', 'dist', 'allreduce', 'ranks'],
                        choices=['tools', 'hooks', 'dist', 'allreduce', 'ranks'])
    parser.add_argument('--ranks-intervals', type=int, nargs='+', default=[1, 50],
                        help="logger intervals of the 'ranks' part (the hook gathers once per interval)")
    parser.add_argument('--out', help='also write the tables (markdown) to this file')
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix='xcit_overhead_') as tmp:
        measure(args, Path(tmp))


def measure(args: argparse.Namespace, tmp: Path) -> None:
    """Run the asked-for parts with their work dirs under tmp; print (and write) the tables."""
    args.site = tmp / 'site'
    args.site.mkdir()
    (args.site / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    python = sys.executable
    ours = [python, 'tools/train.py', args.config]
    out = [f'load average at start: {os.getloadavg()[0]:.2f} (2 alternated sides; ratios, not absolute times)',
           f'{args.iters} iterations per run ({args.batch_size} images per process), first {args.skip} left out', '']
    counter = [0]

    def wd(name):
        counter[0] += 1
        return tmp / f'{counter[0]:02d}_{name}'

    if 'tools' in args.parts:
        print('toolkit tools/train.py against mmdet tools/train.py (one process):')
        rows = []
        for pair in range(args.pairs):
            sides = [('toolkit', ours), ('mmdet', [python, mmdet_train_tool(), args.config])]
            if pair % 2:
                sides.reverse()
            res = {name: run(name, argv, wd(name), args, {}) for name, argv in sides}
            rows.append([pair + 1, f'{res["toolkit"]["median"]:.3f}', f'{res["mmdet"]["median"]:.3f}',
                         f'{res["toolkit"]["median"] / res["mmdet"]["median"]:.3f}',
                         f'{res["toolkit"]["load"]:.1f} / {res["mmdet"]["load"]:.1f}'])
        out += ['### tools/train.py (toolkit) against mmdet tools/train.py, one process', '',
                table(rows, ['pair', 'toolkit s/iter (median)', 'mmdet s/iter (median)', 'ratio',
                             'load avg (toolkit / mmdet)']), '']
    if 'hooks' in args.parts:
        print('toolkit hooks all on against all off (one process):')
        from xcit_dense.engine.planning.declared_hooks import (
            toolkit_hooks,  # as configs/_base_/toolkit_hooks.py declares them
        )
        off = [f'default_hooks.{name}=None' for name in toolkit_hooks()]
        rows, parts = [], []
        for pair in range(args.pairs):
            sides = [('hooks on', []), ('hooks off', off)]
            if pair % 2:
                sides.reverse()
            res = {name: run(name, ours, wd(name.replace(' ', '_')), args, dict(options=list(opts)))
                   for name, opts in sides}
            parts += res['hooks on']['parts']
            rows.append([pair + 1, f'{res["hooks on"]["median"]:.3f}', f'{res["hooks off"]["median"]:.3f}',
                         f'{100 * relative_cost([res["hooks on"]["median"]], [res["hooks off"]["median"]]):+.1f} %',
                         f'{res["hooks on"]["load"]:.1f} / {res["hooks off"]["load"]:.1f}'])
        out += ['### toolkit hooks all on against all off, one process', '',
                table(rows, ['pair', 'on s/iter', 'off s/iter', 'on/off - 1', 'load avg (on / off)']), '']
        iteration = res['hooks on']['median']  # the last pair's 'on' run, whose hooks were timed last
        keys = sorted({k for p in parts for k in p})
        hook_rows = [[k.split('/', 1)[1], f'{1e6 * statistics.median(p.get(k, 0.0) for p in parts):.1f}',
                      f'{100 * statistics.median(p.get(k, 0.0) for p in parts) / iteration:.4f} %']
                     for k in keys if k.startswith('hook/')]
        out += ['### each hook\'s own time per iteration (before_train_iter + after_train_iter), '
                'timed in the "on" run', '',
                table(hook_rows, ['hook', 'us/iter', 'share of an iteration']), '']
    if 'dist' in args.parts and args.procs > 1:
        print(f'{args.procs} processes (tools/dist_train.sh, gloo on CPU):')
        res = run('dist hooks on', ['bash', 'tools/dist_train.sh', args.config, str(args.procs)],
                  wd('dist'), args, dict(PORT=str(29600 + os.getpid() % 300)))
        rows = []
        for rank, part in enumerate(res['parts']):
            for key, value in part.items():
                if key.startswith('collective/') or key in ('hook/PreemptionHook', 'hook/RNGStateHook'):
                    rows.append([rank, key.split('/', 1)[1], f'{1e6 * value:.1f}',
                                 f'{100 * value / res["median"]:.4f} %'])
        out += [f'### {args.procs} processes: the toolkit\'s collectives per iteration '
                f'(iteration median {res["median"]:.3f} s, load {res["load"]:.1f})', '',
                table(rows, ['rank', 'collective / hook', 'us/iter', 'share of an iteration']), '']
    if 'ranks' in args.parts and args.procs > 1:
        for interval in args.ranks_intervals:
            out += ranks_cost(args, interval, wd)
    if 'allreduce' in args.parts:
        load = os.getloadavg()[0]
        times = allreduce_latency()
        out += ['### agree_on_max alone: 2 gloo processes, right after a barrier', '',
                table([[len(times), f'{1e6 * statistics.median(times):.0f}', f'{1e6 * statistics.mean(times):.0f}',
                        f'{load:.1f}']], ['calls', 'median us', 'mean us', 'load avg']), '']
    text = '\n'.join(out)
    print('\n' + text)
    if args.out:
        Path(args.out).write_text(text + '\n')
