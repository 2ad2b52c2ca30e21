"""Real launchers: two torchrun 'nodes' on this machine, bad input, signals and resume."""
import contextlib
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import (
    ROOT,
    free_port,
    hooked_config,
    launch_env,
    pause_hook,
    read_log,
    resumable,
    run,
    run_together,
    run_tool_in_process,
    spawned,
    tiny_seg_config,
    train_cmd,
    wait_for,
)

import xcit_dense

# DDP's warnings about gradients laid out unlike its buckets, and about a deprecated argument: errors
DDP_WARNINGS_AS_ERRORS = ('error:Grad strides do not match bucket view strides:UserWarning,'
                          'error:`broadcast_buffers` is deprecated:FutureWarning')


@pytest.mark.slow  # two launched 'pods', twice (about 50 s); the main stage keeps the node plan's arguments
# (test_netif), the rank figures (test_rank_figures) in process, 2-process launches (test_first_failure) and the
# layout from every operator's variables (test_launch_layout)
def test_two_pods_train_together_stop_on_sigterm_and_resume(tmp_path, seg_data):
    """Two process trees with only a Kubeflow TrainJob pod's variables (PET_*), each running the documented
    command (docs/kubernetes.md: a bare --resume), train together as world size 2. SIGTERM to one pod's
    launcher (the script execs torchrun, the container's first process) while the ranks wait after
    iteration 2: both ranks checkpoint at the next step and stop by themselves within the shutdown timeout
    (torchrun kills none). The job started again continues from that checkpoint to the end; every rank
    ends with the same weights, those of the last checkpoint, without DDP's layout warnings."""
    pause = pause_hook(tmp_path, after_iter=2)
    config = hooked_config(tmp_path, seg_data, max_iters=6, hooks=[pause])
    work_dir = tmp_path / 'run'
    port = free_port()

    def pods():
        with contextlib.ExitStack() as stack:
            procs = [stack.enter_context(spawned(
                ['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '1', '--work-dir', str(work_dir), '--resume'],
                cwd=tmp_path, env=launch_env(PET_NNODES=2, PET_NODE_RANK=rank, PET_NPROC_PER_NODE='cpu',
                                             PET_MASTER_ADDR='127.0.0.1', PET_MASTER_PORT=port, SHUTDOWN_TIMEOUT=120,
                                             PYTHONWARNINGS=DDP_WARNINGS_AS_ERRORS),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) for rank in (1, 0)]
            if not Path(pause['go']).exists():  # the first launch: stopped while paused
                wait_for(Path(pause['ready']), procs[1])
                procs[0].send_signal(signal.SIGTERM)  # pod 1's torchrun, which forwards it to its worker
                Path(pause['go']).touch()
            return procs, [p.communicate(timeout=600)[0] for p in procs]

    procs, outputs = pods()
    assert [p.returncode for p in procs] == [1, 1], outputs[1][-3000:]  # torchrun's status for a stopped worker
    for rank, out in zip((1, 0), outputs):
        assert (f'launch layout: 2 node(s) (PET_NNODES), node rank {rank} (PET_NODE_RANK), master 127.0.0.1 '
                f'(PET_MASTER_ADDR) port {port} (PET_MASTER_PORT), 1 process(es) per node (GPUS; '
                'PET_NPROC_PER_NODE=cpu)') in out
        assert 'SIGKILL' not in out, out[-3000:]
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(work_dir / 'iter_3.pth')
    assert torch.load(work_dir / 'iter_3.pth', weights_only=False)['meta']['iter'] == 3
    log = read_log(work_dir)
    assert 'Run plan: 2 node(s), 2 processes, backend gloo; world size 2' in log

    procs, outputs = pods()
    assert [p.returncode for p in procs] == [0, 0], outputs[1][-3000:]
    # the warnings, not the option: torch 2.6's config dump names broadcast_buffers=False (its option)
    assert not any('Grad strides' in out or '`broadcast_buffers` is deprecated' in out for out in outputs)
    log = read_log(work_dir)
    assert 'resumed epoch: 0, iter: 3' in log and 'Iter(train) [6/6]' in log and 'img_per_s' in log
    host = socket.gethostname()  # every rank in the log: the per-interval line and the run's table
    assert re.search(rf'ranks: 2 rank\(s\): peak memory max \d+ MB resident \(rank [01], {re.escape(host)}\)', log)
    assert re.search(rf'own step time slowest [\d.]+ ms \(rank [01], {re.escape(host)}\), median of the others', log)
    assert '| rank | host | peak memory (MB) | data wait | own step (ms) | communication wait |' in log
    rank0 = torch.load(work_dir / 'rank0.pth', weights_only=True)
    rank1 = torch.load(work_dir / 'rank1.pth', weights_only=True)
    saved = torch.load(work_dir / 'iter_6.pth', weights_only=False)['state_dict']
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
        assert torch.equal(rank0[key], saved[key]), key


@pytest.mark.parametrize('script, args, env, message', [
    ('dist_train.sh', ['missing.py', '1'], {}, 'config file not found: missing.py'),
    ('dist_train.sh', ['CONFIG', 'two'], {}, "GPUS must be a positive integer, got 'two'"),
    ('dist_train.sh', ['CONFIG', '0'], {}, "GPUS must be a positive integer, got '0'"),
    ('dist_train.sh', ['CONFIG', '999'], {}, 'GPUS=999'),
    ('dist_test.sh', ['CONFIG', 'missing.pth', '1'], {}, 'checkpoint file not found: missing.pth'),
    ('slurm_train.sh', ['debug', 'job', 'CONFIG'], {'GPUS': '-1'}, "GPUS must be a positive integer"),
    ('slurm_train.sh', ['debug', 'job', 'CONFIG'], {'GPUS': '6', 'GPUS_PER_NODE': '4'},
     'GPUS=6 is not a multiple of GPUS_PER_NODE=4'),
    ('slurm_train.sh', ['debug', 'job', 'CONFIG'], {'REQUEUE': 'yes'}, "REQUEUE must be 0 or 1, got 'yes'"),
    ('slurm_train.sh', ['debug', 'job', 'CONFIG'], {'REQUEUE': '1', 'SIGNAL_LEAD': '3m'},
     "SIGNAL_LEAD must be a positive integer, got '3m'"),
    ('dist_train.sh', ['CONFIG', '1'], {'PORT': '70000'}, "PORT must be a port number (1-65535), got '70000'"),
    ('slurm_train.sh', ['debug', 'job', 'CONFIG'], {'PORT': '0'}, "PORT must be a port number (1-65535), got '0'"),
    ('slurm_test.sh', ['debug', 'job', 'CONFIG', 'CONFIG'], {'SRUN_ARGS': '--comment "a *'},
     'SRUN_ARGS cannot be split into words (an unbalanced quote?)'),
])
def test_bad_launch_input(tmp_path, seg_data, script, args, env, message):
    config = tiny_seg_config(tmp_path, seg_data)
    args = [str(config) if a == 'CONFIG' else a for a in args]
    proc = run(['bash', str(ROOT / 'tools' / script), *args], cwd=tmp_path, env=launch_env(**env), timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize('env, message', [
    ({'PORT': '70000'}, "PORT must be a port number (1-65535), got '70000'"),
    ({'NNODES': '2', 'NODE_RANK': '2'}, "NODE_RANK must be in 0..1, got '2'"),
    ({'RDZV_TIMEOUT': '10m'}, "RDZV_TIMEOUT must be a positive integer, got '10m'"),
    ({'MAX_RESTARTS': '-1'}, "MAX_RESTARTS must be a non-negative integer, got '-1'"),
])
def test_wrong_launch_values_fail_before_python_starts(tmp_path, env, message):
    """Values checked by their form alone fail at once: no interpreter (and no torch) is started first."""
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\ntouch "$0.started"\nexit 1\n')
    python.chmod(0o755)
    config = tmp_path / 'config.py'
    config.write_text('')
    proc = run(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '1'], cwd=tmp_path,
               env=launch_env(PYTHON=python, **env), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / 'python.started').exists()


def test_port_already_taken(tmp_path, seg_data):
    config = tiny_seg_config(tmp_path, seg_data)
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '1'], cwd=tmp_path,
                   env=launch_env(PORT=port), timeout=120)
    assert proc.returncode != 0
    assert f'port {port} on 127.0.0.1 is already in use' in proc.stderr


def random_run_config(tmp_path, seg_data, max_iters=6, interval=2):
    """``hooked_config`` with everything a resume has to carry over: an LR warmup and step,
    the configs' endless sampler, shuffling that crosses a pass over the data, random flips and drop
    path; pretrained backbone weights from tmp_path/pretrained.pth; SIGKILL after a checkpoint, or
    SIGTERM after an iteration; each image loaded noted in $XCIT_TEST_LOADS, each batch in samples.txt."""
    base = hooked_config(tmp_path, seg_data, max_iters=max_iters, interval=interval)
    pipeline = [dict(type='CountLoads'), dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
                dict(type='RandomFlip', prob=0.5), dict(type='PackSegInputs')]
    pretrained = tmp_path / 'pretrained.pth'
    backbone = xcit_dense.XCiT(arch='tiny_12', embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))
    torch.save(backbone.state_dict(), pretrained)
    cfg = dict(
        _base_=[str(base)],
        model=dict(backbone=dict(drop_path_rate=0.2, init_cfg=dict(
            _delete_=True, type='Pretrained', checkpoint=str(pretrained)))),
        train_dataloader=dict(sampler=dict(type='ResumableInfiniteSampler', shuffle=True),
                              dataset=dict(pipeline=pipeline)),
        param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4),
                         dict(type='MultiStepLR', milestones=[5], gamma=0.1, by_epoch=False)],
        custom_hooks=[dict(type='DumpRankWeightsHook'), dict(type='SigkillAfterCheckpointHook'),
                      dict(type='SigtermAfterIterHook'), dict(type='RecordSamplesHook')])
    path = tmp_path / 'random_run.py'
    path.write_text('\n'.join(f'{k} = {v!r}' for k, v in cfg.items()) + '\n')
    return path


@pytest.mark.slow  # four launched runs in a chain (about 34 s); the main stage keeps the resume's parts in process
# (test_samplers, test_rng_state, test_faults_training's resume under more accumulation)
def test_resume_after_sigkill_then_sigterm_matches_an_uninterrupted_run(tmp_path, seg_data):
    """Killed right after the checkpoint of iteration 2 and resumed, then stopped by SIGTERM after
    iteration 5 (the sampler's second pass over the 8 images, 2 samples in) and resumed again, the
    run ends with the weights of the uninterrupted run (2 data workers; the cut ones load in the main
    process, each image augmented alike): scheduler, sampler position and every RNG continue where
    they were. Each resume loads the images of its own iterations alone. The resumes do not read the
    pretrained file, gone by then."""
    config = random_run_config(tmp_path, seg_data)
    whole_run, killed = run_together(  # independent: the reference beside the run to be killed
        dict(args=train_cmd(config, tmp_path / 'whole', '--cfg-options', 'train_dataloader.num_workers=2',
                            'train_dataloader.persistent_workers=True')),
        dict(args=train_cmd(config, tmp_path / 'cut'), env=launch_env(XCIT_TEST_SIGKILL_AT=2)))
    assert whole_run.returncode == 0, whole_run.stderr[-3000:]
    batches = (tmp_path / 'whole' / 'samples.txt').read_text().splitlines()

    def loaded_in(iterations: slice, loads):
        return sorted(loads.read_text().split()) == sorted(' '.join(batches[iterations]).split())
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / 'cut').glob('*.pth')) == ['iter_2.pth']
    (tmp_path / 'pretrained.pth').unlink()
    loads = tmp_path / 'loads_3_to_5.txt'
    stopped = run(train_cmd(config, tmp_path / 'cut', '--resume'),
                  env=launch_env(XCIT_TEST_SIGTERM_AT=5, XCIT_TEST_LOADS=loads))
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    log = stopped.stdout + stopped.stderr
    assert re.findall(r'Iter\(train\) \[(\d)/6\]', log) == ['3', '4', '5']
    assert 'RNG states restored from the checkpoint' in log and loaded_in(slice(2, 5), loads)
    loads = tmp_path / 'loads_6.txt'
    resumed = run(train_cmd(config, tmp_path / 'cut', '--resume'), env=launch_env(XCIT_TEST_LOADS=loads))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert 'resumed epoch: 0, iter: 5' in log and re.findall(r'Iter\(train\) \[(\d)/6\]', log) == ['6']
    assert 'without loading the trained ones' in log and loaded_in(slice(5, 6), loads)
    whole = torch.load(tmp_path / 'whole' / 'rank0.pth', weights_only=True)
    cut = torch.load(tmp_path / 'cut' / 'rank0.pth', weights_only=True)
    for key in whole:
        torch.testing.assert_close(cut[key], whole[key], rtol=0, atol=1e-6, msg=key)


@pytest.mark.slow  # two launched runs (about 20 s); the main stage keeps a SIGTERM's checkpoint and status in
# test_faults_data's signal inside the bad-sample retry loop
def test_signal_checkpoints_at_the_next_iteration(tmp_path, seg_data):
    """Signalled while it waits after iteration 3 (PauseAfterIterHook: no timing decides when), the run
    saves iter_3.pth at that boundary, before it loads another batch, and stops with 128 + the signal's
    number: SIGTERM and SIGUSR1, one run each, launched side by side."""
    runs = {}
    with contextlib.ExitStack() as stack:
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            folder = tmp_path / signal.Signals(signum).name
            folder.mkdir()
            pause = pause_hook(folder, after_iter=3)
            config = hooked_config(folder, seg_data, max_iters=6, interval=6, hooks=[pause])
            proc = stack.enter_context(spawned(train_cmd(config, folder / 'run'), env=launch_env(),
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            runs[signum] = proc, pause, folder / 'run'
        for signum, (proc, pause, _) in runs.items():
            wait_for(Path(pause['ready']), proc)
            proc.send_signal(signum)
            Path(pause['go']).touch()  # after the signal: the run meets it before its next iteration
        outputs = {signum: proc.communicate(timeout=600)[0] for signum, (proc, _, _) in runs.items()}
    for signum, (proc, _, work_dir) in runs.items():
        out = outputs[signum]
        assert proc.returncode == 128 + signum, out[-2000:]
        assert sorted(p.name for p in work_dir.glob('iter_*.pth')) == ['iter_3.pth']
        assert (work_dir / 'last_checkpoint').read_text().strip() == str(work_dir / 'iter_3.pth')
        assert f'{signal.Signals(signum).name} received: saving a checkpoint' in out
        assert f'checkpoint saved: {work_dir / "iter_3.pth"}; stopping (--resume continues the run)' in out


def test_resume_from_another_model_is_refused(tmp_path, seg_data):
    """Refused once the Runner has built the model, before any training: run in this process."""
    config = tiny_seg_config(tmp_path, seg_data)
    torch.save(resumable(2, state_dict={'backbone.blocks.0.attn.qkv.weight': torch.zeros(3, 3)}),
               tmp_path / 'other.pth')  # a training checkpoint, as another run writes one
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', tmp_path / 'run', '--resume',
                               tmp_path / 'other.pth', cwd=tmp_path)
    assert proc.returncode != 0
    assert 'cannot resume' in proc.stderr and 'saved from a different model' in proc.stderr
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
