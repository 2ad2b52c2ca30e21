"""The prepared GPU check of a machine (``tools/misc/gpu_check.py``): results in OUT_DIR/gpu_check.{json,md},
exit status 1 when a step failed.

The steps (``STEPS``, the registry: one ``Step`` per entry, most telling first), each written to
``gpu_check.json`` and ``gpu_check.md`` as soon as it ends (a check cut short keeps what it
measured): ``ops``, the installed mmcv ops against the golden outputs of compiled mmcv 2.1.0
(``ops_goldens.py``); ``served_ops``, the other ops xcit_mmcv_ext serves (DCN, MaskedConv2d,
RoIPool, focal losses, bbox_overlaps, ms_deform_attn) against their goldens, whose source the result
names (``served_ops_goldens.py``); then the toolkit's own commands on a generated data set, each
judged by what its log must show (``toolkit_runs.py``): ``det_fp16`` (``tools/dist_train.sh``, Mask
R-CNN with the recipe's ops, one process, SyncBN, ``--amp fp16 --accumulation 2``, an epoch
validated, RankFiguresHook's per-rank memory and GPU lines), ``det_resume`` (its ``--resume``),
``det_bf16``; ``fast_vs_plain`` (the backbone's fast set against its plain layers in bf16 and fp16,
timed, and whether docs/speed.md's rule makes the fast set the GPU default: ``fast_vs_plain.py``);
``channels_last`` (the backbone's option on and off giving the same first losses, TF32 off),
``stock_resume`` (mmdet's own ``tools/train.py --resume`` on that work dir) and, last, ``compile``
(the UperNet demo with the backbone compiled in training), which gets whatever time the deadline
leaves. Each step may have a time budget, past which it is cut and recorded as such. A step fails
when it raises and when its results say so (see ``step_failures``). ``tiny=True`` runs every step
at tiny sizes, on a CPU too. The report also lists the GPU path one GPU cannot show
(``NOT_SHOWN``) and the CPU tests covering it meanwhile.

A step is one more entry in ``STEPS``: a name, a function ``(StepContext, seconds) -> result dict``
(``failed_checks``: what its results did not show) and its budget on the lent machine.
"""
import argparse
import dataclasses
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import ops_goldens, served_ops_goldens
from .bounded import BudgetCut
from .fast_vs_plain import DTYPES as FAST_DTYPES, fast_vs_plain
from .toolkit_runs import OUTPUT_TAIL, RUN_TIMEOUT_S as RUN_LIMIT_S, TrainingSteps


@dataclasses.dataclass
class StepContext:
    """What every step of one check gets: the device, the sizes, and the training steps' shared work."""

    device: torch.device
    tiny: bool
    training: TrainingSteps


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the check: ``run(context, seconds)`` returns its result; ``gpu_budget_s``: its
    budget on the lent machine (None: whatever the deadline leaves, for the last step)."""

    name: str
    run: Callable[[StepContext, float], dict]
    gpu_budget_s: Optional[float]


def _training(name: str) -> Callable[[StepContext, float], dict]:
    return lambda context, seconds: context.training.run(name, seconds)


# Most telling first, compile last. Budgets: seconds on the lent machine (16 cores, an H200), from the
# offline rehearsal's CPU seconds with the margin dev/gpu-check-rehearsal.md states, each training run's
# FLOP count on CUDA (about 3.6 s) and det_fp16's prepare() included; 269 s in all, compile then gets
# what is left of the call's 6 minutes (nothing at the phases' and steps' worst case).
STEPS: Tuple[Step, ...] = (
    Step('ops', lambda context, seconds: check_ops(context.device), 6),
    Step('served_ops', lambda context, seconds: check_served_ops(context.device), 8),
    Step('det_fp16', _training('det_fp16'), 45),
    Step('det_resume', _training('det_resume'), 44),
    Step('det_bf16', _training('det_bf16'), 44),
    Step('fast_vs_plain', lambda context, seconds: check_fast_vs_plain(context.device, context.tiny), 20),
    Step('channels_last', _training('channels_last'), 68),
    Step('stock_resume', _training('stock_resume'), 34),
    Step('compile', _training('compile'), None),
)
STEP_NAMES = tuple(step.name for step in STEPS)
GPU_BUDGETS = {step.name: step.gpu_budget_s for step in STEPS if step.gpu_budget_s}
DEADLINE_MARGIN_S = 10  # what the last step leaves of the deadline: writing the report, ending its runs
# The GPU path a one-GPU check cannot exercise, and the CPU tests covering each meanwhile.
NOT_SHOWN = {
    'SyncBN across ranks (statistics reduced over NCCL)':
        'none on CPUs, where SyncBN becomes BN (engine/planning/run_config.adapt_to_machine): '
        'tests/unit/test_gpu_path.py::test_ddp_gets_the_device_set_for_the_rank checks it is kept on GPUs',
    'NCCL collectives between ranks (gradient all-reduce, control collectives)':
        'tests/unit/test_gpu_path.py::test_training_under_a_cuda_only_backend_makes_one_collective_per_step '
        '(cuda:gloo refuses CPU tensors as NCCL does)',
    'the lost-peer bound (a rank waiting for a dead peer under the step bound)':
        'tests/unit/test_wait_bounds.py, '
        'tests/integration/test_faults_training.py::test_killing_one_rank_stops_the_survivor_naming_the_lost_peer',
    'more than one node (rendezvous, the network interface chosen)':
        'tests/integration/test_launch.py::test_two_pods_train_together_stop_on_sigterm_and_resume, '
        'tests/unit/test_netif.py',
    'one CUDA context per rank on a node of several GPUs':
        'tests/unit/test_gpu_path.py::test_a_rank_touches_its_own_gpu_only_and_says_when_it_cannot_use_it',
    "a recompile on one rank extending its peers' step bound (NCCL collectives issued with the compile bound)":
        'tests/unit/test_compile_bound.py::'
        'test_a_compile_on_one_rank_extends_the_step_bound_on_every_rank_and_a_stall_does_not (gloo ranks), '
        'tests/unit/test_wait_bounds.py::test_step_watch_asks_once_for_more_time_and_fires_when_that_passes_too',
    # not a limit of one GPU: left out of the 6-minute budget
    '--auto-fit against a real CUDA out-of-memory (set_per_process_memory_fraction), not run within the budget':
        'tests/integration/test_out_of_memory.py::test_auto_fit_replans_to_what_fits_and_trains_as_that_plan_would, '
        'tests/integration/test_out_of_memory.py::test_the_probe_runs_a_real_mask_rcnn_on_its_synthetic_batch',
}


class StepBudgetExceeded(BudgetCut):
    """Raised inside a step when its time budget has run out (a BaseException: no step swallows it);
    it brings out what the step had done (``BudgetCut``): the cut command's output, results kept."""


class Report:
    """The check's results, rewritten to disk after every step."""

    def __init__(self, out_dir: Path, header: dict):
        self.out_dir = out_dir
        self.data = dict(header=header, steps={})
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, step: str, result: dict) -> None:
        """Record one step's result and write both files at once (atomically)."""
        self.data['steps'][step] = result
        for name, text in (('gpu_check.json', json.dumps(self.data, indent=2, default=float)),
                           ('gpu_check.md', self.markdown())):
            tmp = self.out_dir / f'.{name}.tmp'
            tmp.write_text(text)
            os.replace(tmp, self.out_dir / name)

    def markdown(self) -> str:
        """The results as markdown tables, one section per step."""
        head = self.data['header']
        lines = [f"# GPU check: {head['device_name']}", '',
                 f"torch {head['torch']}, CUDA {head['cuda']}, mmcv {head['mmcv']}, tiny: {head['tiny']}", '',
                 '## What one GPU cannot show (and the CPU tests covering it meanwhile)', '']
        lines += [f'- {path}: {tests}' for path, tests in head['not_shown'].items()] + ['']
        for step, result in self.data['steps'].items():
            lines += [f'## {step}', '']
            if result.get('failed'):
                lines += [f'FAILED: {reason}' for reason in result['failed']] + ['']
            if 'error' in result:
                lines += [f"error: {result['error']}", '']
                continue
            rows = result.get('rows', [])
            if rows:
                keys = list(dict.fromkeys(k for row in rows for k in row))
                lines += ['| ' + ' | '.join(keys) + ' |', '|' + '---|' * len(keys)]
                lines += ['| ' + ' | '.join(_fmt(row.get(k)) for k in keys) + ' |' for row in rows]
                lines.append('')
            lines += [f'- {k}: {_fmt(v)}' for k, v in result.items() if k not in ('rows', 'failed')] + ['']
        return '\n'.join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f'{value:.4g}'
    return '' if value is None else str(value)


def header(device: torch.device, tiny: bool) -> dict:
    """What the check ran on (mmcv None where it is not installed: only steps without it can run)."""
    try:
        import mmcv
        mmcv_version = mmcv.__version__
        ext = 'compiled' if ops_goldens.compiled_mmcv() else "xcit_mmcv_ext (torchvision's kernels)"
    except ImportError:
        mmcv_version = ext = None
    cuda = device.type == 'cuda'
    return dict(device=str(device), tiny=tiny, torch=torch.__version__, cuda=torch.version.cuda,
                mmcv=mmcv_version, mmcv_ext=ext,
                device_name=torch.cuda.get_device_name(device) if cuda else 'CPU',
                capability='%d.%d' % torch.cuda.get_device_capability(device) if cuda else None,
                time=time.strftime('%Y-%m-%d %H:%M:%S'), not_shown=NOT_SHOWN)


# the steps ---------------------------------------------------------------------------------

def check_ops(device: torch.device) -> dict:
    """The installed mmcv ops on ``device`` against compiled mmcv 2.1.0's golden outputs (ops_goldens.py)."""
    return ops_goldens.compare(ops_goldens.load_goldens(), device)


def check_served_ops(device: torch.device) -> dict:
    """The other ops xcit_mmcv_ext serves, on ``device``, against their goldens (served_ops_goldens.py;
    ``source``: compiled mmcv's, or the float64 reference of its semantics)."""
    return served_ops_goldens.compare(served_ops_goldens.load_goldens(), device)


def check_fast_vs_plain(device: torch.device, tiny: bool) -> dict:
    """The fast set against the plain layers (fast_vs_plain.py): a row per dtype, ``fast_default``
    (docs/speed.md's rule) and ``failed_checks``. On a GPU, its memory is given back for the next steps."""
    try:
        result = fast_vs_plain(device, tiny)
    finally:
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    rows = [dict(dtype=name, **result[name]) for name in FAST_DTYPES]
    return dict(rows=rows, fast_default=result['fast_default'], failed_checks=result['failed_checks'])


# the whole check ------------------------------------------------------------------------------

def step_failures(step: str, result: dict) -> List[str]:
    """Why a step's results say it failed (empty: it passed): an exception or a cut, ops that
    disagree with the goldens, or what a training step's log or a comparison did not show (``failed_checks``)."""
    reasons = [f"error: {result['error']}"] if 'error' in result else []
    compared = step in ('ops', 'served_ops')
    if compared and 'rows' in result:
        reasons += [f'{failure} (against the goldens)' for failure in ops_goldens.failures(result)]
    if compared and result.get('all_ok') is False and not reasons:
        reasons.append('all_ok is False')
    reasons += result.get('failed_checks', [])
    return reasons


def run_check(device: torch.device, tiny: bool, out_dir: Path, steps: Optional[List[str]] = None,
              log: Callable[[str], None] = lambda line: print(line, flush=True),
              budgets: Optional[Dict[str, float]] = None, deadline_s: Optional[float] = None) -> dict:
    """Run the chosen steps (all by default, in ``STEPS`` order), writing each result as soon as it
    ends; a step over its budget (seconds, ``budgets``) is cut; a step without one gets what is left
    of ``deadline_s`` (seconds from now, less ``DEADLINE_MARGIN_S``), if given; a failing step is
    recorded with its reasons (``failed``) and the next one runs. The training steps share a
    temporary work folder."""
    report = Report(out_dir, header(device, tiny))
    budgets = budgets or {}
    registry = {step.name: step for step in STEPS}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix='gpu-check-') as tmp:
        context = StepContext(device, tiny, TrainingSteps(device.type, tiny, Path(tmp)))
        for step in steps or list(STEP_NAMES):
            start, cpu_start = time.monotonic(), _cpu_seconds()
            budget = budgets.get(step)
            if budget is None and deadline_s is not None:
                budget = deadline_s - DEADLINE_MARGIN_S - (start - began)
                if budget <= 0:
                    report.add(step, dict(error='not run: no time left before the deadline', cut=True, seconds=0.0,
                                          failed=['not run: no time left before the deadline']))
                    log(f'[gpu_check] {step}: not run (no time left)')
                    continue
            log(f'[gpu_check] {step} ...' + (f' (budget {budget:.0f} s)' if budget else ''))
            try:
                with _budget(budget):
                    result = registry[step].run(context, budget or RUN_LIMIT_S)
            except StepBudgetExceeded as cut:
                result = dict(cut.kept, error=f'cut: over its budget of {budget:g} s', cut=True)
                if cut.outputs:  # the command it cut: its output's end, with when it was cut
                    result['output_tail'] = cut.outputs[-1][-OUTPUT_TAIL:]
            except Exception as exc:  # noqa: BLE001  (a step's failure is a result; the others go on)
                result = dict(error=f'{type(exc).__name__}: {exc}', traceback=traceback.format_exc(limit=5))
            result['seconds'] = time.monotonic() - start
            result['cpu_seconds'] = _cpu_seconds() - cpu_start
            result['failed'] = step_failures(step, result)
            report.add(step, result)
            log(f"[gpu_check] {step}: {'FAILED: ' + '; '.join(result['failed']) if result['failed'] else 'passed'} "
                f"({result['seconds']:.0f} s)")
    return report.data


def _cpu_seconds() -> float:
    """CPU seconds of this process and of every process it started and waited for (the runs,
    through their launchers): what scales with a machine's cores, unlike the wall time."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def failed_steps(data: dict) -> List[str]:
    """The steps of a check's results that failed."""
    return [step for step, result in data['steps'].items() if result.get('failed')]


class _budget:
    """Raise StepBudgetExceeded in the main thread once ``seconds`` have passed (None: no limit).

    A step stuck inside one long C call is interrupted when that call returns to Python; the
    subprocesses of the steps have their own timeouts (run_bounded), and a cut that lands while one
    runs ends it and brings its output out (``BudgetCut``). A cut never lands inside an
    import: it waits for the import to end, since a module cut half-way cannot be imported again
    (torch's operators and mmengine's registries refuse a second registration of the same name)."""

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds

    def __enter__(self) -> None:
        if self.seconds:
            self.previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc) -> None:
        if self.seconds:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)

    @staticmethod
    def _expire(signum, frame) -> None:
        if _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, IMPORT_RETRY_S)
            return
        raise StepBudgetExceeded()


IMPORT_RETRY_S = 0.05  # how soon a cut that came during an import is tried again


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames are among its callers)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith('<frozen importlib'):
            return True
        frame = frame.f_back
    return False


def parse_budgets(items: List[str]) -> Dict[str, float]:
    """--budget STEP=SECONDS ... as a dict; SystemExit naming a bad item."""
    budgets = {}
    for item in items:
        step, _, seconds = item.partition('=')
        try:
            if step not in STEP_NAMES or float(seconds) <= 0:
                raise ValueError
        except ValueError:
            sys.exit(f'error: --budget {item!r}: expected STEP=SECONDS with STEP one of {", ".join(STEP_NAMES)}')
        budgets[step] = float(seconds)
    return budgets


def main(argv: Optional[List[str]] = None) -> int:
    """tools/misc/gpu_check.py's command line: run the check; return its exit status (1 when a step failed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out-dir', type=Path, required=True)
    parser.add_argument('--device', default='cuda', help='cuda (default) or cpu')
    parser.add_argument('--tiny', action='store_true', help='tiny models and sizes (for a CPU, or a quick look)')
    parser.add_argument('--steps', nargs='+', choices=STEP_NAMES, help='only these steps (default: all)')
    parser.add_argument('--budget', nargs='+', default=[], metavar='STEP=SECONDS',
                        help='cut a step past this many seconds (it then fails)')
    parser.add_argument('--gpu-budgets', action='store_true',
                        help="every step's budget sized for the lent GPU machine (GPU_BUDGETS); --budget overrides")
    parser.add_argument('--deadline-s', type=float,
                        help='the whole check: a step without a budget (compile, last) gets what is left')
    args = parser.parse_args(argv)
    budgets = dict(GPU_BUDGETS if args.gpu_budgets else {}, **parse_budgets(args.budget))
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        sys.exit('error: no CUDA device is visible: run on a GPU machine, or pass --device cpu --tiny')
    data = run_check(device, args.tiny, args.out_dir, args.steps, budgets=budgets, deadline_s=args.deadline_s)
    failed = failed_steps(data)
    print(f'[gpu_check] results: {args.out_dir / "gpu_check.md"}')
    if failed:
        print(f'error: steps failed: {", ".join(failed)}', file=sys.stderr)
    return 1 if failed else 0
