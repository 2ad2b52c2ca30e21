"""tools/misc/gpu_check.py: every step at tiny sizes on the CPU, results kept step by step, each training
step failing on what its log lacks (planted faults in real runs), budgets that cut a step, and
subprocesses that never outlive it."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import torch
from helpers import ROOT, free_port, launch_env, spawned

from gpu_check import bounded, machine_check as check, served_ops_goldens, toolkit_runs
from gpu_check.bounded import run_bounded
from xcit_dense.engine.telemetry.node_sampler import NodeUse
from xcit_dense.engine.telemetry.rank_stats import RankFigures, RanksSummary


@pytest.mark.slow
def test_every_step_but_compile_runs_tiny_on_the_cpu_and_its_log_shows_what_it_must(tmp_path):
    """The whole check as users run it, each step's result on disk when its log line comes; the
    compiled UperNet is left out here (inductor's C++ build of its kernels takes minutes on 2
    cores): its judging is tested below, its run in the rehearsal (dev/gpu-check-rehearsal.md)."""
    steps = [step for step in check.STEP_NAMES if step != 'compile']
    on_disk = {}
    with spawned([sys.executable, str(ROOT / 'tools/misc/gpu_check.py'), '--device', 'cpu', '--tiny', '--steps', *steps,
                  '--out-dir', str(tmp_path / 'out')], env=launch_env(), stdout=subprocess.PIPE,
                 stderr=open(tmp_path / 'stderr', 'w'), text=True) as proc:
        for line in proc.stdout:
            if line.startswith('[gpu_check] ') and ': ' in line:
                done = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())['steps']
                on_disk[line.split()[1].rstrip(':')] = list(done)
        returncode = proc.wait(timeout=1200)
    data = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())
    results = data['steps']
    assert list(results) == steps, (tmp_path / 'stderr').read_text()[-3000:]
    assert returncode == 0, {k: v['failed'] for k, v in results.items()}
    assert on_disk['det_fp16'] == ['ops', 'served_ops', 'det_fp16']  # written before the next step ran
    assert results['ops']['all_ok'] and len(results['ops']['rows']) == 18
    served = results['served_ops']  # the CPU path against the float64 reference (the rehearsal of the CUDA one)
    assert served['all_ok'] and served['source'] == served_ops_goldens.REFERENCE_SOURCE and len(served['rows']) == 30
    assert [row['inputs'] for row in served['rows']].count('float16') == len(served_ops_goldens.FP16_OPS)
    assert 'on a CPU these rows test nothing else' in served['fp16_rows']  # (the served ops' widening only)
    fast = results['fast_vs_plain']
    assert [row['dtype'] for row in fast['rows']] == ['bf16', 'fp16'] and isinstance(fast['fast_default'], bool)
    for run in (results['det_fp16'], results['det_bf16']):  # RankFiguresHook's line each logged iteration
        assert run['rank_lines']['memory_kind'] == 'resident' and run['rank_lines']['memory_lines'] >= 2
    assert results['det_bf16']['comm_wait_max'] <= toolkit_runs.COMM_WAIT_MAX  # one rank: no peer to wait for
    # the model's FLOPs counted on the CPU too (on a GPU by default): each step's time holds that count, and
    # det_fp16's the data and configs written first (prepare_s): the GPU budgets include both
    assert all(results[step]['flops_counted'] for step in ('det_fp16', 'det_resume', 'det_bf16', 'stock_resume'))
    assert 0 < results['det_fp16']['prepare_s'] < results['det_fp16']['seconds']
    fp16, resumed, stock = results['det_fp16'], results['det_resume'], results['stock_resume']
    assert fp16['backend'] == 'gloo' and fp16['optim_wrapper'] == 'GuardedOptimWrapper'  # fp32 on a CPU
    assert fp16['accumulative_counts'] == 2 and fp16['coco/bbox_mAP'] is not None and not fp16['syncbn_kept']
    assert resumed['rng_restored'] and resumed['resumed'] == [1, 2] and resumed['epochs_trained'] == [2]
    assert stock['backend'] == 'none' and stock['resumed'] == [2, 4] and stock['epochs_trained'] == [3]
    assert stock['optim_wrapper'] == 'OptimWrapper'  # mmdet's tool: no loss guard, no --amp on a CPU
    assert results['det_bf16']['optim_wrapper'] == 'GuardedOptimWrapper'
    recipe = dict(bbox_roi_extractor='mmcv._ext', mask_roi_extractor='mmcv._ext')
    assert fp16['roi_layers'] == results['det_bf16']['roi_layers'] == recipe  # read from the dumped configs
    assert max(results['channels_last']['relative'].values()) < toolkit_runs.RPN_TOLERANCE
    markdown = (tmp_path / 'out' / 'gpu_check.md').read_text()
    assert '## det_resume' in markdown and '| mask targets (crop_and_resize) |' in markdown


def test_a_failing_step_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    written = []

    def broken(device):
        written.append(json.loads((tmp_path / 'gpu_check.json').read_text())['steps'])
        raise RuntimeError('no kernel image is available')

    monkeypatch.setattr(check, 'check_ops', broken)
    data = check.run_check(torch.device('cpu'), True, tmp_path, ['det_resume', 'ops'], log=lambda line: None)
    assert [list(steps) for steps in written] == [['det_resume']]  # on disk before the next step ran
    assert data['steps']['det_resume']['failed'] == ["no checkpoint of det_fp16's run to resume (epoch_1.pth)"]
    assert data['steps']['ops']['error'] == 'RuntimeError: no kernel image is available'
    on_disk = json.loads((tmp_path / 'gpu_check.json').read_text())
    assert on_disk['steps']['ops']['error'] == data['steps']['ops']['error']
    assert 'error: RuntimeError: no kernel image' in (tmp_path / 'gpu_check.md').read_text()


@pytest.mark.slow  # two real training runs of the check (about a minute): the slow stage, beside the whole check
def test_planted_faults_fail_their_steps_and_the_exit_status(tmp_path, monkeypatch):
    """Real runs of a config whose loss guard and RNG-state hook are switched off: the first run
    builds a plain OptimWrapper, the resumed one restores no RNG state; both steps fail, naming it."""
    lines = toolkit_runs.det_config_lines
    monkeypatch.setattr(toolkit_runs, 'det_config_lines', lambda work, sizes: lines(work, sizes) + [
        'default_hooks.update(nonfinite_loss=None, rng_state=None)'])
    status = check.main(['--device', 'cpu', '--tiny', '--steps', 'det_fp16', 'det_resume',
                         '--out-dir', str(tmp_path)])
    steps = json.loads((tmp_path / 'gpu_check.json').read_text())['steps']
    wrong = 'optimizer wrapper OptimWrapper, GuardedOptimWrapper expected'
    assert status == 1 and steps['det_fp16']['failed'] == [wrong], steps['det_fp16'].get('output_tail')
    assert steps['det_resume']['failed'] == [wrong, 'no "RNG states restored from the checkpoint" line']
    assert steps['det_resume']['resumed'] == [1, 2]  # the rest of what it must show is there
    assert 'FAILED: no "RNG states restored' in (tmp_path / 'gpu_check.md').read_text()


def test_the_compiled_upernet_trains_and_validates_at_one_input_size_and_counts_its_flops(tmp_path):
    """The compile step's config at the GPU's sizes: a batch of its training pipeline through the
    preprocessor in training and one of its validation pipeline in evaluation have one input size, the
    run's image size (the demo's 128-px Resize under a 256-px preprocessor gave validation 128 px: a
    second size, which the compiled backbone meets with a recompile for symbolic sizes). And it asks
    RankFiguresHook to count the model's FLOPs on every device (by default on a GPU only), as the
    detector's config does (below): the CPU rehearsal's step times then hold that count."""
    from mmengine import Config
    from mmengine.dataset import pseudo_collate
    from mmengine.registry import DATASETS, MODELS, DefaultScope

    from xcit_dense.datasets.synthetic import write_segmentation_set
    sizes = toolkit_runs.Sizes.for_run(tiny=False)
    image = (sizes.image, sizes.image)
    for split in ('training', 'validation'):
        write_segmentation_set(tmp_path / 'ade', split, 1, size=image)
    config = toolkit_runs.write_config(tmp_path / 'upernet.py', toolkit_runs.seg_config_lines(tmp_path, sizes))
    cfg = Config.fromfile(str(config))
    shapes = {}
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        preprocessor = MODELS.build(cfg.model.data_preprocessor)
        for loader, training in (('train_dataloader', True), ('val_dataloader', False)):
            dataset = DATASETS.build(dict(cfg[loader].dataset, serialize_data=False))  # (its gc.collect: 1 s)
            shapes[loader] = tuple(preprocessor(pseudo_collate([dataset[0]]), training)['inputs'].shape[-2:])
    assert shapes == dict(train_dataloader=image, val_dataloader=image)
    assert cfg.default_hooks.rank_figures == dict(type='RankFiguresHook', warn=False, flops=True)


def test_a_log_with_a_non_finite_loss_without_its_metric_or_compiling_nothing_fails(tmp_path):
    output = ('process group: gloo, 1 processes\n'
              'XCiT: torch.compile failed, running eagerly (BackendCompilerFailed: no compiler)\n'
              'Epoch(train) [1][1/2]  lr: 1e-4  loss: 2.5000  loss_cls: 1.1000\n'
              'Epoch(train) [1][2/2]  lr: 1e-4  loss: nan  loss_cls: nan\n')
    result = toolkit_runs.judge(toolkit_runs.Run(0, output, tmp_path), toolkit_runs.Expect(
        backend='gloo', metric='coco/bbox_mAP', first_epoch=1, compiled=True))
    assert result['failed_checks'] == [
        'non-finite losses: [nan]', 'no metric line with coco/bbox_mAP',
        'XCiT: torch.compile failed, running eagerly']
    assert result['first'] == dict(loss=2.5, loss_cls=1.1)


def _shifted_roi_align(monkeypatch) -> None:
    """mmcv.ops.roi_align, its outputs shifted by 1e-3 (about 5e-4 of the largest golden value)."""
    import mmcv.ops
    real = mmcv.ops.roi_align
    monkeypatch.setattr(mmcv.ops, 'roi_align', lambda *a, **k: real(*a, **k) + 1e-3)


def test_ops_disagreeing_beyond_the_tolerance_are_flagged(monkeypatch):
    _shifted_roi_align(monkeypatch)
    result = check.check_ops(torch.device('cpu'))
    flagged = {row['op'] for row in result['rows'] if not row['ok']}
    assert not result['all_ok'] and {'roi_align aligned=True sampling=0', 'roi_align aligned=False sampling=2',
                                     'roi_align from channels_last features'} <= flagged
    assert not {op for op in flagged if 'nms' in op or 'backward' in op}


def test_an_ops_mismatch_fails_its_step_and_the_exit_status(tmp_path, monkeypatch):
    """The installed kernels shifted by 1e-3 against the goldens: the check exits 1, naming the ops."""
    _shifted_roi_align(monkeypatch)
    status = check.main(['--device', 'cpu', '--tiny', '--steps', 'ops', '--out-dir', str(tmp_path)])
    ops = json.loads((tmp_path / 'gpu_check.json').read_text())['steps']['ops']
    assert status == 1 and ops['all_ok'] is False
    assert any(reason.startswith('roi_align aligned=True sampling=0: max relative difference')
               for reason in ops['failed'])
    assert 'FAILED: roi_align aligned=False sampling=0' in (tmp_path / 'gpu_check.md').read_text()


def test_the_served_ops_goldens_are_small_and_say_where_they_came_from():
    assert served_ops_goldens.GOLDENS.stat().st_size < 500_000
    goldens = served_ops_goldens.load_goldens()
    assert goldens['source'] == served_ops_goldens.REFERENCE_SOURCE and len(goldens['outputs']) == 25


@pytest.mark.slow  # the float64 reference of every served op, then the ops in float32 and fp16 (about 20 s loaded)
def test_the_served_ops_goldens_are_the_reference_of_todays_inputs(tmp_path):
    """The committed file holds what make_reference_goldens writes now: its inputs are make_inputs()'s
    and its outputs the float64 reference's (a file left stale by a change of either fails)."""
    made = served_ops_goldens.make_reference_goldens(tmp_path / 'goldens.pt')
    kept = served_ops_goldens.load_goldens()
    assert made['inputs'].keys() == kept['inputs'].keys() and made['outputs'].keys() == kept['outputs'].keys()
    for part in ('inputs', 'outputs'):
        for name, value in made[part].items():
            torch.testing.assert_close(kept[part][name], value, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.slow  # the served ops twice (float32 and fp16 autocast) in-process: about 5 s on a loaded CPU
def test_a_served_op_off_mmcvs_semantics_fails_its_step_naming_it(tmp_path, monkeypatch):
    """RoIPool's far corner without its +1 pixel (torchvision's and a careless port's rule): the
    served_ops step fails on RoIPool's float32 rows only (its fp16 row compares the fp16 path with the
    float32 one, which the fault moves alike), and the report names the goldens' source."""
    import importlib
    ext = importlib.import_module('mmcv.ops.roi_pool').ext_module  # (mmcv.ops.roi_pool is also the function)
    real = ext.roi_pool_forward

    def no_plus_one(input, rois, *args, **kwargs):
        rois = rois.clone()
        rois[:, 3:] -= 1  # (x2 - 1 + 1) * scale: the far corner as given
        return real(input, rois, *args, **kwargs)

    monkeypatch.setattr(ext, 'roi_pool_forward', no_plus_one)
    status = check.main(['--device', 'cpu', '--tiny', '--steps', 'served_ops', '--out-dir', str(tmp_path)])
    served = json.loads((tmp_path / 'gpu_check.json').read_text())['steps']['served_ops']
    assert status == 1 and served['all_ok'] is False
    assert {reason.split(':')[0] for reason in served['failed']} == {
        'roi_pool', 'roi_pool_grad'}, served['failed']
    assert f'- source: {served_ops_goldens.REFERENCE_SOURCE}' in (tmp_path / 'gpu_check.md').read_text()


@pytest.mark.slow  # the served ops three times (float32, half-rounded in float32, fp16) in-process: about 10 s loaded
def test_the_served_ops_fp16_rows_feed_fp16_inputs_and_fail_on_a_fault_of_the_half_path_only(monkeypatch):
    """RoIPool 5% off for fp16 inputs only (a half path gone wrong): its fp16 row fails and no other
    row does, so the fp16 rows ran the ops on fp16 inputs (autocast leaves the inputs of mmcv.ops'
    Functions as they are: fed float32, the fp16 rows repeated the float32 ones). The result names
    the ops compared in float32 only and what the fp16 rows test with the served ops on a CPU."""
    import importlib
    ext = importlib.import_module('mmcv.ops.roi_pool').ext_module
    real = ext.roi_pool_forward

    def off_for_half(input, rois, output, *args, **kwargs):
        real(input, rois, output, *args, **kwargs)
        if input.dtype == torch.float16:
            output.mul_(1.05)

    monkeypatch.setattr(ext, 'roi_pool_forward', off_for_half)
    served = check.check_served_ops(torch.device('cpu'))
    assert [row['op'] for row in served['rows'] if not row['ok']] == ['roi_pool of fp16 inputs under fp16 autocast']
    fp16 = [row['op'] for row in served['rows'] if row['inputs'] == 'float16']
    assert fp16 == [f'{op} of fp16 inputs under fp16 autocast' for op in served_ops_goldens.FP16_OPS]
    assert set(served['float_only']) == {'masked_conv', 'softmax_focal', 'bbox_overlaps'}
    assert "the served ops' widening of fp16 inputs to float32" in served['fp16_rows']
    assert 'on a CPU these rows test nothing else' in served['fp16_rows']


@pytest.mark.parametrize('step, result, reason', [
    ('det_fp16', dict(failed_checks=['exited 1']), 'exited 1'),
    ('ops', dict(rows=[], all_ok=False), 'all_ok is False'),
    ('compile', dict(error='cut: over its budget of 5 s', cut=True), 'error: cut: over its budget of 5 s'),
])
def test_results_that_say_a_step_failed_fail_it_and_the_exit_status(step, result, reason):
    assert reason in check.step_failures(step, result)
    data = dict(steps={'ops': dict(rows=[], all_ok=True, failed=[]),
                       step: dict(result, failed=check.step_failures(step, result))})
    assert step in check.failed_steps(data)


def test_results_of_passing_steps_fail_nothing():
    assert check.step_failures('det_fp16', dict(failed_checks=[], exit_status=0)) == []
    assert check.step_failures('ops', dict(rows=[dict(op='nms', ok=True)], all_ok=True)) == []


def test_a_step_over_its_budget_is_cut_and_the_next_runs(tmp_path):
    data = check.run_check(torch.device('cpu'), True, tmp_path, ['det_fp16', 'ops'], log=lambda line: None,
                           budgets={'det_fp16': 3})
    cut = data['steps']['det_fp16']
    assert cut['error'] == 'cut: over its budget of 3 s' or cut['exit_status'] == 'timeout', cut
    assert cut['seconds'] < 15 and cut['failed']
    assert data['steps']['ops']['failed'] == [] and check.failed_steps(data) == ['det_fp16']


def test_a_budget_cut_during_an_import_waits_for_the_import_to_end(tmp_path, monkeypatch):
    """The alarm comes while a module is being imported: the module is still imported whole (a
    half-run module, removed from sys.modules with its registrations kept, breaks every later
    import of it) and the cut comes right after."""
    (tmp_path / 'xcit_budget_probe.py').write_text(
        'import signal, sys\n'
        'from gpu_check import machine_check as check\n'
        'check._budget._expire(signal.SIGALRM, sys._getframe())  # the alarm, during this import\n'
        'WHOLE = True\n')
    monkeypatch.syspath_prepend(tmp_path)
    try:
        with pytest.raises(check.StepBudgetExceeded):
            with check._budget(600):
                import xcit_budget_probe  # noqa: F401
                time.sleep(60)  # the deferred cut ends this at once
        assert sys.modules['xcit_budget_probe'].WHOLE
    finally:
        sys.modules.pop('xcit_budget_probe', None)


def _grandchild_command(pid_file: Path) -> list:
    """bash starting a long child in a session of its own, as torchrun starts its workers; its pid
    goes to pid_file."""
    return ['bash', '-c', f'setsid sleep 300 & echo $! > {pid_file}; wait']


def _gone(pid: int) -> bool:
    try:
        state = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return True
    return '\nState:\tZ' in state  # reaped by nobody yet, but ended


@contextmanager
def _ended_afterwards(where: Path) -> Iterator[None]:
    """Kill the processes ``where`` names once the block ends (a pid file, or a folder of files named
    by pids), so that a failing test leaves nothing running."""
    try:
        yield
    finally:
        pids = [int(p.name) for p in where.iterdir()] if where.is_dir() else [int(where.read_text())] \
            if where.is_file() else []
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_subprocess_past_its_timeout_is_killed_with_its_children_in_other_sessions(tmp_path):
    with _ended_afterwards(tmp_path / 'pid'):
        proc = run_bounded(_grandchild_command(tmp_path / 'pid'), timeout=1)
        assert proc.returncode == 'timeout' and 'killed after 1.' in proc.stderr and 1 <= proc.killed_after_s < 5
        assert _gone(int((tmp_path / 'pid').read_text()))


def test_a_budget_cut_kills_the_running_subprocess_and_its_children(tmp_path):
    with _ended_afterwards(tmp_path / 'pid'):
        with pytest.raises(check.StepBudgetExceeded):
            with check._budget(1):
                run_bounded(_grandchild_command(tmp_path / 'pid'), timeout=120)
        assert _gone(int((tmp_path / 'pid').read_text()))


def test_a_step_cut_at_its_budget_keeps_the_output_it_cut_and_what_channels_last_had_measured(tmp_path, monkeypatch):
    """channels_last cut by its budget in its second run: the step's result holds the first run's
    judged result and the end of the cut run's output with when it was cut (gpu_check.json had only
    "cut: over its budget"), and the cut run's processes are gone. The runs are stand-ins for
    tools/dist_train.sh: the first prints its first training line, the second hangs after a line."""
    pid_file = tmp_path / 'pid'

    def dist_train(config, work_dir, args, timeout, env=None):
        first = 'echo "process group: gloo"; echo "Epoch(train) [1][1/2]  loss: 2.5  loss_rpn_cls: 0.75"'
        stuck = f'echo "building the model"; setsid sleep 60 & echo $! > {pid_file}; wait'
        script = first if 'model.backbone.channels_last=True' in args else stuck
        return toolkit_runs.run_command(['bash', '-c', script], work_dir, timeout, tmp_path, env)

    monkeypatch.setattr(toolkit_runs, 'dist_train', dist_train)
    steps = toolkit_runs.TrainingSteps('cpu', True, tmp_path / 'work')
    steps.prepare()
    monkeypatch.setattr(check, 'STEPS', (check.Step('channels_last', lambda context, seconds:
                                                    steps.channels_last(seconds), 1),))
    monkeypatch.setattr(check, 'STEP_NAMES', ('channels_last',))
    with _ended_afterwards(pid_file):
        data = check.run_check(torch.device('cpu'), True, tmp_path / 'out', log=lambda line: None,
                               budgets={'channels_last': 1})
        assert _gone(int(pid_file.read_text()))
    result = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())['steps']['channels_last']
    assert result == json.loads(json.dumps(data['steps']['channels_last']))
    assert result['error'] == 'cut: over its budget of 1 s' and result['failed'] == [f"error: {result['error']}"]
    assert result['channels_last=True']['first'] == dict(loss=2.5, loss_rpn_cls=0.75)
    tail = result['output_tail']
    assert re.fullmatch(r"building the model\n\n\[cut after [\d.]+ s by its caller's budget; every process it "
                        r'started ended\]', tail), tail


def test_the_output_of_a_killed_command_is_read_with_a_timeout(tmp_path, monkeypatch):
    """A process out of the walk's reach (orphaned before it: init adopted it) holds the output
    pipe: run_bounded still returns, with what was written, soon after the kill."""
    monkeypatch.setattr(bounded, 'READ_S', 0.5)
    pid_file = tmp_path / 'pid'
    with _ended_afterwards(pid_file):
        proc = run_bounded(['bash', '-c', f'(setsid sleep 60 & echo $! > {pid_file}); echo started; sleep 60'],
                           timeout=1)
        assert proc.returncode == 'timeout' and proc.stdout == 'started\n' and proc.killed_after_s >= 1


@pytest.mark.slow  # torchrun imports torch (about 10 s on 2 loaded cores)
def test_torchruns_workers_end_with_their_step(tmp_path):
    """torchrun of 2 workers (a script without torch that writes its pid and sleeps), cut 5 s after
    both started: every worker is gone when run_bounded has returned, within 15 s of the cut. The
    cut is the step budget's (the alarm) since torchrun's own start takes longer than 5 s on a
    loaded CPU; the timeout ends the tree through the same end_tree (tested above)."""
    worker = tmp_path / 'worker.py'
    worker.write_text('import os, sys, time\n'
                      'open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()\n'
                      'time.sleep(300)\n')
    pids = tmp_path / 'pids'
    pids.mkdir()
    cut_at = []

    def arm_when_started() -> None:
        while len(list(pids.iterdir())) < 2:
            time.sleep(0.05)
        cut_at.append(time.monotonic())
        signal.setitimer(signal.ITIMER_REAL, 5)

    threading.Thread(target=arm_when_started, daemon=True).start()
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc-per-node', '2', '--master-port', str(free_port()),
           str(worker), str(pids)]
    with _ended_afterwards(pids):
        with pytest.raises(check.StepBudgetExceeded):
            with check._budget(120):  # the test's own bound; the 5 s cut comes from the thread
                run_bounded(cmd, timeout=120)
        returned = time.monotonic()
        workers = [int(p.name) for p in pids.iterdir()]
        assert len(workers) == 2 and all(_gone(pid) for pid in workers)
        assert returned - cut_at[0] < 15


def test_the_detector_steps_build_the_recipes_roi_align_served_by_mmcv_ext(tmp_path):
    """The demo's RoI extractors call torchvision's op (use_torchvision); the check's detector config
    puts the recipe's back, and judge reads the built layers from the dumped config. (The config also
    counts the model's FLOPs on every device, as the UperNet one does: tested above.)"""
    from mmengine import Config
    steps = toolkit_runs.TrainingSteps('cpu', True, tmp_path)
    steps.prepare()
    cfg = Config.fromfile(str(steps.det))
    assert cfg.default_hooks.rank_figures == dict(type='RankFiguresHook', warn=False, flops=True)
    assert toolkit_runs.roi_layers(cfg) == dict(bbox_roi_extractor='mmcv._ext', mask_roi_extractor='mmcv._ext')
    demo = Config.fromfile(str(toolkit_runs.DET_DEMO))
    assert set(toolkit_runs.roi_layers(demo).values()) == {"torchvision's roi_align"}
    (tmp_path / 'work').mkdir()
    demo.dump(str(tmp_path / 'work' / steps.det.name))
    result = toolkit_runs.judge(toolkit_runs.Run(0, 'Epoch(train) [1][1/2]  loss: 2.5\n', tmp_path / 'work'),
                                toolkit_runs.Expect(backend=None, recipe_roi_align=True), steps.det)
    assert result['failed_checks'] == ["RoI layers {'bbox_roi_extractor': \"torchvision's roi_align\", "
                                       "'mask_roi_extractor': \"torchvision's roi_align\"}, mmcv._ext's RoIAlign "
                                       "expected (the recipe's)"]


@pytest.mark.parametrize('line, failure', [
    ('RNG states restored from the checkpoint, except the CUDA states of 2 GPU(s), but this process sees 1: '
     'those random numbers continue from the seed', 'not restored'),
    ('RNG state not restored: the checkpoint holds 2 rank(s), this run has 1', 'not restored'),
    ('', 'no "RNG states restored from the checkpoint" line'),
])
def test_a_resume_passes_on_the_complete_restore_line_only(tmp_path, line, failure):
    log = '2026/12/03 12:00:00 - mmengine - {} - {}\n'
    complete = log.format('INFO', 'RNG states restored from the checkpoint')
    output = ('process group: gloo\nresumed epoch: 1, iter: 2\nEpoch(train) [2][1/2]  loss: 2.5\n')
    expect = toolkit_runs.Expect(backend='gloo', resumed=(1, 2))
    passed = toolkit_runs.judge(toolkit_runs.Run(0, complete + output, tmp_path), expect)
    assert passed['failed_checks'] == [] and passed['rng_restored']
    partial = log.format('WARNING', line) if line else ''
    result = toolkit_runs.judge(toolkit_runs.Run(0, partial + output, tmp_path), expect)
    assert not result['rng_restored'] and result['failed_checks'][0].startswith(failure)
    if line:  # the complete line beside a partial one (another rank, another hook) does not save it
        both = toolkit_runs.judge(toolkit_runs.Run(0, complete + partial + output, tmp_path), expect)
        assert not both['rng_restored'] and both['failed_checks'][0].startswith('not restored')


def test_the_last_step_gets_what_the_deadline_leaves_and_the_report_says_what_one_gpu_cannot_show(
        tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(check, 'STEPS', (
        check.Step('first', lambda context, seconds: seen.setdefault('first', seconds) and dict(failed_checks=[]), 5),
        check.Step('last', lambda context, seconds: seen.setdefault('last', seconds) and dict(failed_checks=[]), None)))
    monkeypatch.setattr(check, 'STEP_NAMES', ('first', 'last'))
    data = check.run_check(torch.device('cpu'), True, tmp_path, log=lambda line: None, budgets={'first': 5},
                           deadline_s=60)
    assert seen['first'] == 5 and 40 < seen['last'] <= 60 - check.DEADLINE_MARGIN_S
    assert check.failed_steps(data) == []
    data = check.run_check(torch.device('cpu'), True, tmp_path, log=lambda line: None, deadline_s=5)
    assert data['steps']['last']['failed'] == ['not run: no time left before the deadline']
    markdown = (tmp_path / 'gpu_check.md').read_text()
    assert '## What one GPU cannot show' in markdown
    assert '- more than one node (rendezvous, the network interface chosen): tests/integration/' in markdown
    for tests in check.NOT_SHOWN.values():  # each named test exists
        for name in re.findall(r'tests/[\w/]+\.py(?:::\w+)?', tests):
            path, _, function = name.partition('::')
            assert (ROOT / path).is_file() and (not function or f'def {function}(' in (ROOT / path).read_text()), name


def _ranks_line(device: str, mig: bool = False) -> str:
    """RankFiguresHook's log line as the hook writes it (rank_stats.RanksSummary.line), for one rank."""
    node = None
    if device == 'cuda':
        node = NodeUse(interface=None, received_mb_s=None, sent_mb_s=None, gpu_utilisation=None if mig else 81.0,
                       gpu_memory_mb=3071.0, gpu_memory_total_mb=143771.0, mig=mig)
    figures = RankFigures(rank=0, host=f'{device}-host', memory_mb=2113.0 if device == 'cuda' else 1480.0,
                          reserved_mb=2342.0 if device == 'cuda' else None, data_wait=0.031, own_step_s=None,
                          interval_s=1.0, node=node)
    return f'ranks: {RanksSummary([figures]).line()}\n'


RANKS_CUDA, RANKS_MIG, RANKS_CPU = _ranks_line('cuda'), _ranks_line('cuda', mig=True), _ranks_line('cpu')


@pytest.mark.parametrize('device, line, failures', [
    ('cuda', RANKS_CUDA, []),
    ('cuda', RANKS_MIG, []),  # a MIG slice: NVML gives memory only
    ('cuda', RANKS_CPU, ['no per-rank memory line', 'no per-rank GPU utilisation and memory line']),  # no NVML
    ('cuda', RANKS_CUDA.split('; data wait')[0].replace('allocated', 'resident') + '\n',
     ['no per-rank memory line', 'no per-rank GPU utilisation and memory line']),
    ('cpu', RANKS_CPU, []),
    ('cpu', '', ['no per-rank memory line']),
])
def test_a_detector_run_fails_without_its_per_rank_memory_and_gpu_lines(tmp_path, device, line, failures):
    """RankFiguresHook's line in the detector steps' logs: peak memory always, NVML's GPU utilisation
    and memory on CUDA; the step names what its log lacks."""
    output = 'process group: gloo\n' + line + 'Epoch(train) [1][1/2]  loss: 2.5\n'
    result = toolkit_runs.judge(toolkit_runs.Run(0, output, tmp_path),
                                toolkit_runs.Expect(backend='gloo', rank_lines=device))
    assert [reason.split(' (')[0].split(':')[0] for reason in result['failed_checks']] == failures
    if not failures:
        lines = result['rank_lines']
        assert lines['memory_lines'] == 1 and lines['peak_memory_mb'] in (2113, 1480)
        assert device == 'cpu' or lines['gpu_memory_mb'] == 3071 and lines['gpu_utilisation'] in (81.0, 'n/a (MIG)')


def _achieved_line(mfu) -> str:
    """RankFiguresHook's line on a GPU where the model's FLOPs were counted, with MFU where the peak is known."""
    figures = RankFigures(rank=0, host='cuda-host', memory_mb=2113.0, reserved_mb=2342.0, data_wait=0.031,
                          own_step_s=None, interval_s=1.0, tflops=41.3, mfu=mfu)
    return f'ranks: {RanksSummary([figures]).line()}\n'


NOT_COUNTED = ('12/05 14:48:23 - mmengine - WARNING - achieved FLOP/s not measured: counting the model failed '
               '(RuntimeError: Detected that you are using FX to torch.jit.trace a dynamo-optimized function.)\n')


@pytest.mark.parametrize('device, line, failures, achieved', [
    ('cuda', _achieved_line(0.042), [], dict(rate='41.30 TFLOP/s', mfu_percent=4.2)),
    ('cuda', _achieved_line(None), [], dict(rate='41.30 TFLOP/s', mfu_percent=None)),  # the peak unknown
    ('cuda', NOT_COUNTED + RANKS_CUDA, ['achieved FLOP/s not measured'], None),
    ('cuda', RANKS_CUDA, ['no achieved FLOP/s in the per-rank lines'], None),
    ('cpu', RANKS_CPU, [], None),  # CPUs count only where the config asks
    ('cpu', NOT_COUNTED + RANKS_CPU, ['achieved FLOP/s not measured'], None),
])
def test_the_compile_step_fails_where_the_model_was_not_counted(tmp_path, device, line, failures, achieved):
    """The compiled UperNet's log (``Expect.flops``): on CUDA the per-rank lines give the achieved FLOP/s
    (the compiled backbone counted on its eager forward), and on no device did counting fail."""
    output = 'process group: gloo\n' + line + 'Iter(train) [1/2]  loss: 2.5\n'
    result = toolkit_runs.judge(toolkit_runs.Run(0, output, tmp_path),
                                toolkit_runs.Expect(backend='gloo', flops=device))
    assert [reason.split(' (')[0].split(':')[0] for reason in result['failed_checks']] == failures
    assert result['achieved'] == (achieved or dict(rate=None, mfu_percent=None))


@pytest.mark.parametrize('waits, failures', [
    ([0.004, 0.012], []),
    ([0.004, 0.31], ['rank 0 waited in gradient communication up to 31.0% of its iterations']),  # the old clock's
    ([], ["no ranks/comm_wait/rank0 in the run's scalars.json"]),
])
def test_a_detector_step_fails_where_its_one_rank_waits_in_communication(tmp_path, waits, failures):
    """One GPU has no peer to wait for: the detector steps read rank 0's communication wait from the newest
    run's scalars and fail above 5% (a step clock that counts the GPU's backward as waiting)."""
    older, newest = tmp_path / '20261205_100000' / 'vis_data', tmp_path / '20261205_110000' / 'vis_data'
    for folder, records in ((older, [0.9]), (newest, waits)):
        folder.mkdir(parents=True)
        (folder / 'scalars.json').write_text(''.join(
            json.dumps({'step': i + 1, 'loss': 2.5, 'ranks/comm_wait/rank0': wait}) + '\n'
            for i, wait in enumerate(records)) + json.dumps({'step': 9, 'loss': 2.4}) + '\n')
    output = 'process group: gloo\nEpoch(train) [1][1/2]  loss: 2.5\n'
    result = toolkit_runs.judge(toolkit_runs.Run(0, output, tmp_path),
                                toolkit_runs.Expect(backend='gloo', comm_wait=True))
    assert [reason.split(',')[0].split(' (')[0] for reason in result['failed_checks']] == failures
    assert result['comm_wait_max'] == (max(waits) if waits else None)
