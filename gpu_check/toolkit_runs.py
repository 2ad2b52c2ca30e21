"""The GPU check's training steps: the toolkit's own commands on a generated data set, each judged
by what its log must show.

Every step runs a command a user runs (``tools/dist_train.sh`` with one process, mmdet's own
``tools/train.py``) in a subprocess under a time limit, and :func:`judge` reads its output: the
exit status, the process group's backend (NCCL on a GPU, gloo on a CPU), the optimizer wrapper and
the RoI layers the run built (from the config the Runner dumped into its work dir), finite losses,
the validation's metric line, and for a resumed run the toolkit's line for a complete restore of the
RNG states (any line of a partial one fails it) and the position it resumed at, and for the detector
runs RankFiguresHook's per-rank lines (peak memory; on a GPU NVML's utilisation and memory). The steps share one
work folder: the resumed runs continue ``det_fp16``'s run.

Mask R-CNN is the demo's XCiT-T12/16 (configs/demo) with the recipe's SyncBN and RoIAlign put back
(mmcv.ops.RoIAlign on ``mmcv._ext``, which every configs/xcit/mask_rcnn_* runs; the demo calls
torchvision's op directly); on a GPU at 256x256 images, with ``tiny`` a 4-block, 64-channel backbone
on 64x64 images (for a CPU).
"""
import json
import math
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .bounded import BudgetCut, run_bounded

ROOT = Path(__file__).resolve().parents[1]
DET_DEMO = ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py'
SEG_DEMO = ROOT / 'configs/demo/upernet_xcit_tiny_12_p16_demo.py'
TINY_BACKBONE = dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))
OUTPUT_TAIL = 2500  # characters of a failed or cut run's output kept in its result
RUN_TIMEOUT_S = 900  # any one run without a step budget; below NCCL's 30-minute collective timeout
# relative, the first iteration's numbers with channels_last on and off, TF32 off in both runs: the RPN's losses
# follow from the features alone; the heads' also from which proposals were sampled, which a last-bit
# difference of a score can change (and with it loss and grad_norm)
RPN_TOLERANCE = 1e-3
# one rank has no peer to wait for: its communication wait is its own all-reduce's (RankFiguresHook)
COMM_WAIT_MAX = 0.05
HEADS_TOLERANCE = 1e-2
LAYOUT_COMPARED = dict(loss_rpn_cls=RPN_TOLERANCE, loss_rpn_bbox=RPN_TOLERANCE, loss_cls=HEADS_TOLERANCE,
                       loss_bbox=HEADS_TOLERANCE, loss_mask=HEADS_TOLERANCE, loss=HEADS_TOLERANCE,
                       grad_norm=HEADS_TOLERANCE)
NO_TF32 = dict(NVIDIA_TF32_OVERRIDE='0')  # cuBLAS and cuDNN in full float32, whatever torch's settings
TRAIN_STEPS = ('det_fp16', 'det_resume', 'det_bf16', 'stock_resume', 'channels_last', 'compile')
EXPECTED_WRAPPER = {  # --amp: the optimizer wrapper a run must build, on a GPU and on a CPU (fp32 there)
    'fp16': dict(cuda='GuardedAmpOptimWrapper', cpu='GuardedOptimWrapper'),
    'bf16': dict(cuda='GuardedBF16OptimWrapper', cpu='GuardedOptimWrapper'),
    None: dict(cuda='GuardedOptimWrapper', cpu='GuardedOptimWrapper')}
LOSS = re.compile(r'\bloss: (\S+)')
# MMEngine's training line; its first numbers are [epoch][iter/iters] (epoch-based) or [iter/iters]
TRAIN_LINE = re.compile(r'(?:Epoch|Iter)\(train\)\s*(?:\[(\d+)\])?\s*\[\s*(\d+)/\d+\][^\n]*')
RESUMED = re.compile(r'resumed epoch: (\d+), iter: (\d+)')
# the toolkit's line for a complete restore (engine/training/rng_state_hook.py), and those for a partial or no restore
COMPLETE_RESTORE = re.compile(r'^[^\n]* - INFO - RNG states restored from the checkpoint$', re.M)
NOT_RESTORED = re.compile(r'^[^\n]*(?:restored from the checkpoint, except|RNG state was not in the checkpoint'
                          r'|RNG state not restored)[^\n]*$', re.M)
ANSI = re.compile(r'\x1b\[[0-9;]*m')  # the console's colours, if any
# the recipe's RoIAlign (mmdet's base Mask R-CNN): served by mmcv._ext, not torchvision's op called directly
RECIPE_ROI_LAYER = dict(_delete_=True, type='RoIAlign', sampling_ratio=0)
EAGER_FALLBACK = re.compile(r'XCiT: [^\n]*running eagerly')
# RankFiguresHook counts the model's FLOPs on every device, as it does by default on a GPU only: the CPU
# rehearsal's step times then hold that count's cost, which the GPU budgets must include
COUNT_FLOPS = 'rank_figures=dict(flops=True)'
FLOPS_COUNTED = re.compile(r'training FLOPs counted at \d+x\d+')  # the hook's line once it has counted
# RankFiguresHook's line per logger interval (engine/telemetry/rank_stats.RanksSummary.line): the ranks' peak memory
# (CUDA: allocated, with reserved; CPU: resident), and on a GPU NVML's utilisation and memory of the node's GPUs
RANK_MEMORY = re.compile(r'ranks: (\d+) rank\(s\): peak memory max (\d+) MB (allocated|resident)')
RANK_GPU = re.compile(r'ranks: [^\n]*GPU utilisation (?:min (\d+)%|(n/a) \(MIG\))[^\n;]*, '
                      r'GPU memory max (\d+) of (\d+) MB')
# its achieved FLOP/s (and MFU where the device's peak is known), and its warning where counting the model failed
ACHIEVED = re.compile(r'ranks: [^\n]*; achieved (\S+ [TG]FLOP/s) per rank(?:, MFU ([\d.]+)%)?')
NOT_COUNTED = re.compile(r'achieved FLOP/s not measured[^\n]*')


@dataclass
class Sizes:
    """How big the runs are: images, split sizes, the backbone (None: the config's)."""

    image: int
    train: int
    val: int
    seg_iters: int
    backbone: Optional[dict] = None

    @classmethod
    def for_run(cls, tiny: bool) -> 'Sizes':
        return cls(64, 4, 2, 2, TINY_BACKBONE) if tiny else cls(256, 16, 8, 20)


@dataclass
class Expect:
    """What a run's output must show."""

    backend: str
    wrapper: Optional[str] = None
    accumulation: Optional[int] = None
    metric: Optional[str] = None
    resumed: Optional[tuple] = None  # (epoch, iter) MMEngine says it resumed at
    first_epoch: Optional[int] = None  # the first epoch this run trains
    syncbn_kept: Optional[bool] = None
    compiled: bool = False
    recipe_roi_align: bool = False  # the built RoI extractors run mmcv.ops.RoIAlign on mmcv._ext
    rank_lines: Optional[str] = None  # the device type whose per-rank lines the log must hold (RankFiguresHook)
    flops: Optional[str] = None  # the device type: the achieved FLOP/s logged on CUDA, and no failed count anywhere
    comm_wait: bool = False  # rank 0's communication wait in the run's scalars, at most COMM_WAIT_MAX


def free_port() -> int:
    """A TCP port free on this host now (torchrun's rendezvous of each run)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def write_data(work: Path, sizes: Sizes) -> None:
    """The generated COCO-format and ADE20K-layout sets the runs read."""
    from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set
    size = (sizes.image, sizes.image)
    write_coco_set(work / 'coco', 'train', sizes.train, size=size, seed=0)
    write_coco_set(work / 'coco', 'val', sizes.val, size=size, seed=1)
    write_segmentation_set(work / 'ade', 'training', sizes.train, size=size, seed=2)
    write_segmentation_set(work / 'ade', 'validation', sizes.val, size=size, seed=3)


def det_config_lines(work: Path, sizes: Sizes) -> List[str]:
    """A user's config over the Mask R-CNN demo: SyncBN and RoIAlign as in the recipe (the demo's
    torchvision RoIAlign would leave mmcv._ext's unexercised), the generated set at this image size,
    one epoch validated, a checkpoint each epoch, a log line each iteration."""
    data = f"{work / 'coco'}/"
    backbone = dict(sizes.backbone or {}, norm_cfg=dict(type='SyncBN', requires_grad=True))
    neck = ', neck=dict(in_channels=[64] * 4)' if sizes.backbone else ''
    roi_head = (f'roi_head=dict(bbox_roi_extractor=dict(roi_layer={dict(RECIPE_ROI_LAYER, output_size=7)!r}), '
                f'mask_roi_extractor=dict(roi_layer={dict(RECIPE_ROI_LAYER, output_size=14)!r}))')
    load = "dict(type='LoadImageFromFile', color_type='color_ignore_orientation')"  # as the demo's
    annotations = "dict(type='LoadAnnotations', with_bbox=True, with_mask=True)"
    resize = f"dict(type='Resize', scale={(sizes.image, sizes.image)!r}, keep_ratio=True)"
    loader = f'batch_size=2, num_workers=2, dataset=dict(data_root={data!r}, pipeline='
    return [f'_base_ = [{str(DET_DEMO)!r}]',
            f'model = dict(backbone={backbone!r}{neck}, {roi_head})',
            f"train_pipeline = [{load}, {annotations}, {resize}, dict(type='RandomFlip', prob=0.5), "
            "dict(type='PackDetInputs')]",
            f"test_pipeline = [{load}, {resize}, {annotations}, dict(type='PackDetInputs', meta_keys=("
            "'img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]",
            f'train_dataloader = dict({loader}train_pipeline))',
            f'val_dataloader = dict({loader}test_pipeline))',
            'test_dataloader = val_dataloader',
            f"val_evaluator = dict(ann_file={data + 'annotations/instances_val.json'!r})",
            'test_evaluator = val_evaluator',
            'train_cfg = dict(max_epochs=1, val_interval=1)',
            f'default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1), {COUNT_FLOPS})']


def seg_config_lines(work: Path, sizes: Sizes) -> List[str]:
    """A user's config over the UperNet demo: SyncBN, the generated set, the backbone compiled in
    training, a few iterations then validation. One input size in training and validation: the
    pipelines resize to the image size the preprocessor pads to (the demo's 128-px ``Resize`` kept
    under a larger preprocessor size gives validation a second size, which the compiled backbone
    meets with a recompile for symbolic sizes)."""
    data = f"{work / 'ade'}/"
    image = (sizes.image, sizes.image)
    backbone = dict(sizes.backbone or {}, compile=True, norm_cfg=dict(type='SyncBN', requires_grad=True))
    heads = ("decode_head=dict(in_channels=[64] * 4, channels=32), "
             "auxiliary_head=dict(in_channels=64, channels=16)") if sizes.backbone else ''
    load = "dict(type='LoadImageFromFile', color_type='color_ignore_orientation')"  # as the demo's
    resize = f"dict(type='Resize', scale={image!r}, keep_ratio=True)"
    loader = f'batch_size=2, num_workers=2, dataset=dict(data_root={data!r}, pipeline='
    iters = sizes.seg_iters
    return [f'_base_ = [{str(SEG_DEMO)!r}]',
            f'model = dict(data_preprocessor=dict(size={image!r}), backbone={backbone!r}, {heads})',
            f"train_pipeline = [{load}, dict(type='LoadAnnotations'), {resize}, dict(type='RandomFlip', prob=0.5), "
            "dict(type='PackSegInputs')]",
            f"test_pipeline = [{load}, {resize}, dict(type='LoadAnnotations'), dict(type='PackSegInputs')]",
            f'train_dataloader = dict({loader}train_pipeline))',
            f'val_dataloader = dict({loader}test_pipeline))',
            'test_dataloader = val_dataloader',
            f'train_cfg = dict(max_iters={iters}, val_interval={iters})',
            f'param_scheduler = [dict(type="ConstantLR", factor=1.0, by_epoch=False, begin=0, end={iters})]',
            f'default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval={iters}), {COUNT_FLOPS})']


def write_config(path: Path, lines: Sequence[str]) -> Path:
    path.write_text('\n'.join(lines) + '\n')
    return path


@dataclass
class Run:
    """One command's outcome: exit status, its output and its work dir."""

    exit_status: object
    output: str
    work_dir: Path
    seconds: float = 0.0
    killed_after_s: Optional[float] = None  # killed past its time limit, with every process it started


def run_command(cmd: List[str], work_dir: Path, timeout: float, cwd: Path,
                env: Optional[Dict[str, str]] = None) -> Run:
    """A run under ``timeout`` seconds (it and every process it started killed past it), output
    captured; ``env``: added to the environment."""
    env = dict(os.environ, PORT=str(free_port()), PYTHON=sys.executable, PYTHONUNBUFFERED='1', **(env or {}))
    start = time.monotonic()
    proc = run_bounded(cmd, timeout=max(1.0, min(timeout, RUN_TIMEOUT_S)), env=env, cwd=cwd)
    return Run(proc.returncode, proc.stdout + proc.stderr, work_dir, time.monotonic() - start, proc.killed_after_s)


def dist_train(config: Path, work_dir: Path, args: Sequence[str], timeout: float,
               env: Optional[Dict[str, str]] = None) -> Run:
    """``bash tools/dist_train.sh CONFIG 1 --work-dir WORK ARGS``, from the config's folder."""
    cmd = ['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '1', '--work-dir', str(work_dir), *args]
    return run_command(cmd, work_dir, timeout, config.parent, env)


def stock_train(config: Path, work_dir: Path, args: Sequence[str], timeout: float) -> Run:
    """mmdet's own ``tools/train.py`` (what ``mim train mmdet`` runs), one process."""
    import mmdet
    tool = Path(mmdet.__file__).parent / '.mim' / 'tools' / 'train.py'
    return run_command([sys.executable, str(tool), str(config), '--work-dir', str(work_dir), *args],
                       work_dir, timeout, config.parent)


def dumped_config(work_dir: Path, config: Path):
    """The config the Runner dumped into its work dir (what the run built its parts from)."""
    from mmengine import Config
    return Config.fromfile(str(work_dir / config.name))


def roi_layers(cfg) -> Dict[str, str]:
    """What each RoI extractor of a detector config builds: ``mmcv._ext`` for mmcv.ops.RoIAlign on
    mmcv's extension, else what it is (torchvision's op, another layer)."""
    from mmcv.ops import RoIAlign
    found = {}
    for name in ('bbox_roi_extractor', 'mask_roi_extractor'):
        layer = dict(cfg.model.roi_head[name].roi_layer)
        kind = layer.pop('type')
        if kind != 'RoIAlign':
            found[name] = kind
            continue
        built = RoIAlign(**layer)
        found[name] = "torchvision's roi_align" if built.use_torchvision else 'mmcv._ext'
    return found


def first_losses(output: str) -> Dict[str, float]:
    """The first training line's numbers (loss, grad_norm, the loss terms) by name."""
    line = TRAIN_LINE.search(output)
    if not line:
        return {}
    return {name: float(value) for name, value in re.findall(r'\b(loss\w*|grad_norm): (\S+)', line.group(0))}


def judge(run: Run, expect: Expect, config: Optional[Path] = None) -> dict:
    """What the run's output shows, and ``failed``: each thing it had to show and did not."""
    out, failed = ANSI.sub('', run.output), []
    result = dict(exit_status=run.exit_status, seconds=round(run.seconds, 1))
    if run.killed_after_s is not None:
        result['killed_after_s'] = round(run.killed_after_s, 1)
        failed.append(f'killed after {run.killed_after_s:.0f} s (its time limit), every process it started with it')
    elif run.exit_status != 0:
        failed.append(f'exited {run.exit_status}')
        if not TRAIN_LINE.search(out):  # it never trained: the rest would only repeat that
            return dict(result, failed_checks=failed, output_tail=out[-OUTPUT_TAIL:])
    group = re.search(r'process group: (\w+)', out)
    result['backend'] = group.group(1) if group else None
    if result['backend'] != expect.backend:
        failed.append(f"backend {result['backend']}, {expect.backend} expected")
    train_lines = [m.group(0) for m in TRAIN_LINE.finditer(out)]
    losses = [float(v) for line in train_lines for v in LOSS.findall(line)]
    result.update(train_lines=len(train_lines), first=first_losses(out),
                  last_loss=losses[-1] if losses else None, flops_counted=bool(FLOPS_COUNTED.search(out)))
    if not losses:
        failed.append('no training line with a loss')
    elif not all(math.isfinite(v) for v in losses):
        failed.append(f'non-finite losses: {[v for v in losses if not math.isfinite(v)]}')
    if expect.metric:
        metric = re.search(rf'{re.escape(expect.metric)}: (-?[\d.]+)', out)
        result[expect.metric] = float(metric.group(1)) if metric else None
        if metric is None:
            failed.append(f'no metric line with {expect.metric}')
    if expect.syncbn_kept is not None:
        replaced = 'SyncBN replaced by BN' in out
        result['syncbn_kept'] = not replaced
        if replaced == expect.syncbn_kept:
            failed.append('SyncBN replaced by BN' if replaced else 'SyncBN kept without a GPU')
    if expect.wrapper or expect.accumulation:
        try:
            wrapper = dumped_config(run.work_dir, config).optim_wrapper
            result['optim_wrapper'] = wrapper.get('type')
            result['accumulative_counts'] = wrapper.get('accumulative_counts', 1)
        except Exception as exc:  # noqa: BLE001  (no dumped config: the run did not get that far)
            result['optim_wrapper'] = f'unknown ({type(exc).__name__}: {exc})'
        if expect.wrapper and result['optim_wrapper'] != expect.wrapper:
            failed.append(f"optimizer wrapper {result['optim_wrapper']}, {expect.wrapper} expected")
        if expect.accumulation and result.get('accumulative_counts') != expect.accumulation:
            failed.append(f"accumulative_counts {result.get('accumulative_counts')}, "
                          f'{expect.accumulation} expected')
    if expect.recipe_roi_align:
        try:
            result['roi_layers'] = roi_layers(dumped_config(run.work_dir, config))
        except Exception as exc:  # noqa: BLE001  (no dumped config: the run did not get that far)
            result['roi_layers'] = f'unknown ({type(exc).__name__}: {exc})'
        if not isinstance(result['roi_layers'], dict) or set(result['roi_layers'].values()) != {'mmcv._ext'}:
            failed.append(f"RoI layers {result['roi_layers']}, mmcv._ext's RoIAlign expected (the recipe's)")
    if expect.resumed:
        result['rng_restored'] = bool(COMPLETE_RESTORE.search(out))
        partial = NOT_RESTORED.findall(out)
        if partial:
            result['rng_restored'] = False
            failed += [f'not restored: {line.strip()[-200:]}' for line in partial]
        elif not result['rng_restored']:
            failed.append('no "RNG states restored from the checkpoint" line')
        resumed = RESUMED.search(out)
        result['resumed'] = tuple(map(int, resumed.groups())) if resumed else None
        if result['resumed'] != tuple(expect.resumed):
            failed.append(f"resumed at {result['resumed']}, {tuple(expect.resumed)} (epoch, iter) expected")
    if expect.first_epoch is not None:
        epochs = sorted({int(m.group(1)) for m in TRAIN_LINE.finditer(out) if m.group(1)})
        result['epochs_trained'] = epochs
        if not epochs or epochs[0] != expect.first_epoch:
            failed.append(f'trained epochs {epochs}, from epoch {expect.first_epoch} expected')
    if expect.rank_lines:
        failed += _judge_rank_lines(out, expect.rank_lines, result)
    if expect.comm_wait:
        failed += _judge_comm_wait(run.work_dir, result)
    if expect.flops:
        achieved, not_counted = ACHIEVED.findall(out), NOT_COUNTED.search(out)
        rate, mfu = achieved[-1] if achieved else (None, None)
        result['achieved'] = dict(rate=rate, mfu_percent=float(mfu) if mfu else None)
        if not_counted or (expect.flops == 'cuda' and not achieved):
            failed.append(not_counted.group(0) if not_counted else 'no achieved FLOP/s in the per-rank lines '
                          '("achieved ... per rank, MFU ...", RankFiguresHook)')
    if expect.compiled:
        eager = EAGER_FALLBACK.search(out)
        result['compiled'] = eager is None
        if eager:
            failed.append(eager.group(0))
    if failed:
        result['output_tail'] = out[-OUTPUT_TAIL:]
    result['failed_checks'] = failed
    return result


def _judge_comm_wait(work_dir: Path, result: dict) -> List[str]:
    """Rank 0's ``ranks/comm_wait/rank0`` over the run's intervals (its newest ``scalars.json``, into
    ``result['comm_wait_max']``) and what is wrong with it: a single rank waits only for its own
    all-reduce, so a larger share means the step clock counts compute as waiting (on a GPU: a host clock
    stopped when the kernels were queued, not when they ran)."""
    runs = sorted(work_dir.glob('*/vis_data/scalars.json'))
    records = [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()] if runs else []
    waits = [record['ranks/comm_wait/rank0'] for record in records if 'ranks/comm_wait/rank0' in record]
    result['comm_wait_max'] = max(waits) if waits else None
    if not waits:
        return ['no ranks/comm_wait/rank0 in the run\'s scalars.json (RankFiguresHook under DDP)']
    if max(waits) > COMM_WAIT_MAX:
        return [f'rank 0 waited in gradient communication up to {max(waits):.1%} of its iterations, over '
                f'{COMM_WAIT_MAX:.0%}: one rank has no peer to wait for']
    return []


def _judge_rank_lines(out: str, device: str, result: dict) -> List[str]:
    """RankFiguresHook's per-rank lines in the log (into ``result['rank_lines']``) and what is missing:
    the peak memory line (allocated on CUDA, resident on a CPU) and, on CUDA, NVML's GPU
    utilisation and memory (utilisation 'n/a' on a MIG slice, where NVML reports none)."""
    memory, gpu, failed = RANK_MEMORY.findall(out), RANK_GPU.findall(out), []
    kind = 'allocated' if device == 'cuda' else 'resident'
    lines = result['rank_lines'] = dict(memory_lines=len(memory), gpu_lines=len(gpu))
    if memory:
        lines.update(ranks=int(memory[-1][0]), peak_memory_mb=int(memory[-1][1]), memory_kind=memory[-1][2])
    if not memory or memory[-1][2] != kind:
        failed.append(f'no per-rank memory line ("ranks: N rank(s): peak memory max ... MB {kind}", '
                      'RankFiguresHook)' + (f': memory {memory[-1][2]}' if memory else ''))
    if device == 'cuda':
        if gpu:
            utilisation, mig, used, total = gpu[-1]
            lines.update(gpu_utilisation=float(utilisation) if utilisation else f'{mig} (MIG)',
                         gpu_memory_mb=int(used), gpu_memory_total_mb=int(total))
        else:
            failed.append('no per-rank GPU utilisation and memory line ("GPU utilisation min ...%, GPU memory max '
                          '... of ... MB" in the "ranks:" lines): NVML (nvidia-ml-py) not importable, or no NVML '
                          "device with the UUID of the rank's GPU")
    return failed


class TrainingSteps:
    """The training steps of one check, sharing a work folder (``det_resume`` and ``stock_resume``
    continue ``det_fp16``'s run)."""

    def __init__(self, device_type: str, tiny: bool, work: Path):
        self.device, self.tiny, self.work = device_type, tiny, work
        self.sizes = Sizes.for_run(tiny)
        self.backend = 'nccl' if device_type == 'cuda' else 'gloo'
        self.iters_per_epoch = math.ceil(self.sizes.train / 2)
        self._ready = False

    def prepare(self) -> None:
        """Generate the data and write the configs, once."""
        if self._ready:
            return
        self.work.mkdir(parents=True, exist_ok=True)
        write_data(self.work, self.sizes)
        self.det = write_config(self.work / 'check_mask_rcnn.py', det_config_lines(self.work, self.sizes))
        self.seg = write_config(self.work / 'check_upernet.py', seg_config_lines(self.work, self.sizes))
        self._ready = True

    def _expect(self, amp: Optional[str], **kw) -> Expect:
        return Expect(backend=self.backend, wrapper=EXPECTED_WRAPPER[amp][self.device],
                      syncbn_kept=self.device == 'cuda', **kw)

    def run(self, step: str, timeout: float) -> dict:
        """Run one step, preparing first if no step has (the first step's budget includes it: about a
        second at the GPU's sizes, ``prepare_s`` in its result); its result, ``failed_checks`` empty when
        the log showed everything."""
        if self._ready:
            return getattr(self, step)(timeout)
        start = time.monotonic()
        self.prepare()
        prepared = time.monotonic() - start
        return dict(getattr(self, step)(timeout - prepared), prepare_s=round(prepared, 2))

    def det_fp16(self, timeout: float) -> dict:
        """An epoch of Mask R-CNN with fp16 and accumulation 2, validated."""
        args = ['--amp', 'fp16', '--accumulation', '2']
        run = dist_train(self.det, self.work / 'det', args, timeout)
        return judge(run, self._expect('fp16', accumulation=2, metric='coco/bbox_mAP', first_epoch=1,
                                       recipe_roi_align=True, rank_lines=self.device,
                                       # (the tiny run's one optimizer step is its first, which is not timed)
                                       comm_wait=not self.tiny), self.det)

    def det_resume(self, timeout: float) -> dict:
        """``--resume`` of det_fp16's run for a second epoch."""
        if not (self.work / 'det' / 'epoch_1.pth').is_file():
            return dict(failed_checks=["no checkpoint of det_fp16's run to resume (epoch_1.pth)"])
        args = ['--amp', 'fp16', '--accumulation', '2', '--resume', '--cfg-options', 'train_cfg.max_epochs=2']
        run = dist_train(self.det, self.work / 'det', args, timeout)
        return judge(run, self._expect('fp16', accumulation=2, metric='coco/bbox_mAP', first_epoch=2,
                                       resumed=(1, self.iters_per_epoch)), self.det)

    def det_bf16(self, timeout: float) -> dict:
        """An epoch of Mask R-CNN with bf16, validated."""
        run = dist_train(self.det, self.work / 'det_bf16', ['--amp', 'bf16'], timeout)
        return judge(run, self._expect('bf16', metric='coco/bbox_mAP', first_epoch=1, recipe_roi_align=True,
                                       rank_lines=self.device, comm_wait=True), self.det)

    def stock_resume(self, timeout: float) -> dict:
        """mmdet's own tools/train.py ``--resume`` on det_fp16's work dir, for a third epoch (one
        process without a process group: MMEngine's resume on the GPU, SyncBN as BN)."""
        if not (self.work / 'det' / 'last_checkpoint').is_file():
            return dict(failed_checks=["no last_checkpoint in det_fp16's work dir"])
        args = ['--resume', '--cfg-options', 'train_cfg.max_epochs=3']
        if self.device == 'cuda':
            args.insert(0, '--amp')  # mmdet's flag: AmpOptimWrapper (it refuses a CPU)
        last = 2 if (self.work / 'det' / 'epoch_2.pth').is_file() else 1  # det_resume ran, or not
        run = stock_train(self.det, self.work / 'det', args, timeout)
        wrapper = 'AmpOptimWrapper' if self.device == 'cuda' else 'OptimWrapper'  # mmdet's own, no guard
        return judge(run, Expect(backend='none', wrapper=wrapper, metric='coco/bbox_mAP', first_epoch=last + 1,
                                 resumed=(last, last * self.iters_per_epoch)), self.det)

    def channels_last(self, timeout: float) -> dict:
        """The first iteration's losses and gradient norm with the backbone's channels_last on and off,
        TF32 off in both runs (it alone moves a first loss by about 1%): the RPN's losses within
        ``RPN_TOLERANCE``, the heads', the total and grad_norm within ``HEADS_TOLERANCE``. Cut by its
        budget, it keeps the result of a run that had ended (``channels_last=True``: the first run's)."""
        first = {}
        runs = {}
        try:
            for on in (True, False):
                work = self.work / f'channels_last_{on}'
                args = ['--cfg-options', f'model.backbone.channels_last={on}', 'train_dataloader.dataset.indices=2',
                        'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']  # one iteration, no validation
                runs[on] = judge(dist_train(self.det, work, args, timeout / 2, NO_TF32), self._expect(None), self.det)
                first[on] = runs[on]['first']
        except BudgetCut as cut:
            cut.kept.update((f'channels_last={on}', run) for on, run in runs.items())
            raise
        failed = [f'channels_last={on}: {reason}' for on, r in runs.items() for reason in r['failed_checks']]
        differences = {}
        for name, tolerance in LAYOUT_COMPARED.items():
            a, b = first[True].get(name), first[False].get(name)
            if a is None or b is None:
                failed.append(f'{name} missing from the first training line')
                continue
            differences[name] = abs(a - b) / max(abs(b), 1e-12)
            if differences[name] > tolerance:
                failed.append(f'{name}: {a} with channels_last, {b} without '
                              f'(relative {differences[name]:.2g} > {tolerance})')
        return dict(first_on=first[True], first_off=first[False], relative=differences, tf32='off',
                    seconds=round(sum(r.get('seconds', 0) for r in runs.values()), 1), failed_checks=failed)

    def compile(self, timeout: float) -> dict:
        """The UperNet demo with the backbone compiled in training, then validated; on a GPU its per-rank
        lines give the achieved FLOP/s (the model counted on its backbone's eager forward)."""
        run = dist_train(self.seg, self.work / 'seg', [], timeout)
        return judge(run, Expect(backend=self.backend, metric='mIoU', compiled=True,
                                 syncbn_kept=self.device == 'cuda', flops=self.device))
