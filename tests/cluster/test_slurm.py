"""The Slurm launch scripts on a real one-host Slurm cluster: train, test, preemption + requeue."""
import re
import subprocess
import time
from typing import Iterator

import pytest
import slurm_cluster
import torch
from helpers import ROOT, free_port, hooked_config, launch_env, read_log, require_capability, run

pytestmark = pytest.mark.cluster


@pytest.fixture(scope='module')
def private_cluster() -> Iterator[slurm_cluster.PrivateSlurmCluster]:
    """A private cluster for this module, stopped (and checked to be gone) at the end."""
    reason = slurm_cluster.missing_reason()
    require_capability('slurm', not reason, reason)
    with slurm_cluster.running(slurm_cluster.PrivateSlurmCluster()) as cluster:
        yield cluster


@pytest.fixture
def slurm(private_cluster: slurm_cluster.PrivateSlurmCluster) -> Iterator[slurm_cluster.PrivateSlurmCluster]:
    """The module's cluster; a test's jobs still queued when it ends (say, it failed) are scancelled."""
    yield private_cluster
    cancelled = private_cluster.cancel_jobs()
    if cancelled:
        print(f'\nscancelled the jobs this test left: {cancelled}')


def slurm_env(cluster: slurm_cluster.PrivateSlurmCluster, **extra: object) -> dict:
    """The launch scripts' environment, aimed at the private cluster."""
    return launch_env(GPUS=2, GPUS_PER_NODE=2, CPUS_PER_TASK=1, PORT=free_port(),
                      SLURM_CONF=cluster.env['SLURM_CONF'], **extra)


def test_slurm_train_then_slurm_test(slurm, tmp_path, seg_data):
    config = hooked_config(tmp_path, seg_data)
    work_dir = tmp_path / 'run'
    # SRUN_ARGS split like shell words, never globbed: unquoted, '*' became the names in tmp_path
    train = run(['bash', str(ROOT / 'tools/slurm_train.sh'), 'debug', 'xcit-train', str(config), str(work_dir)],
                cwd=tmp_path, env=slurm_env(slurm, SRUN_ARGS="--comment='xcit *'"), timeout=900)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    jobs = slurm.run('scontrol', 'show', 'job').stdout.split('\n\n')
    assert any('JobName=xcit-train' in job and 'Comment=xcit *' in job for job in jobs), jobs
    log = read_log(work_dir)
    assert 'Run plan: 1 node(s), 2 processes, backend gloo; world size 2' in log
    assert 'img_per_s' in log
    test = run(['bash', str(ROOT / 'tools/slurm_test.sh'), 'debug', 'xcit-test', str(config),
                str(work_dir / 'iter_4.pth'), '--work-dir', str(tmp_path / 'eval')],
               cwd=tmp_path, env=slurm_env(slurm), timeout=900)
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]
    assert re.search(r'mIoU: \d', test.stdout + test.stderr)


def job_field(cluster: slurm_cluster.PrivateSlurmCluster, job: str, field: str) -> str:
    """One field of `scontrol show job` ('' when absent)."""
    out = cluster.run('scontrol', 'show', 'job', job).stdout
    match = re.search(rf'\b{field}=(\S+)', out)
    return match.group(1) if match else ''


def epoch_config(folder, seg_data, slow: float = 0.0):
    """The launcher tests' tiny config as an epoch loop, as the recipe's Mask R-CNN runs: 2 epochs of
    4 iterations at 2 ranks x 1 image, the samples shuffled, a checkpoint at each epoch's end."""
    folder.mkdir(parents=True)
    config = hooked_config(folder, seg_data, slow=slow)
    config.write_text(config.read_text() + (
        "train_cfg = dict(_delete_=True, type='EpochBasedTrainLoop', max_epochs=2, val_interval=2)\n"
        "train_dataloader['batch_size'] = 1\n"
        "train_dataloader['sampler'] = dict(_delete_=True, type='ResumableSampler', shuffle=True)\n"
        "default_hooks['checkpoint'] = dict(interval=1, by_epoch=True)\n"
        "log_processor = dict(by_epoch=True)\n"))
    return config


def test_preemption_mid_epoch_checkpoints_requeues_and_ends_as_the_uninterrupted_run(slurm, tmp_path, seg_data):
    """SIGUSR1 in the second epoch of an epoch loop: the requeued job continues at the next sample
    (before, MMEngine's epoch loop trained the whole epoch again) and ends with the weights of the
    same run uninterrupted."""
    reference_dir = tmp_path / 'reference'
    reference = run(['bash', str(ROOT / 'tools/slurm_train.sh'), 'debug', 'xcit-reference',
                     str(epoch_config(reference_dir, seg_data)), str(reference_dir / 'run')],
                    cwd=tmp_path, env=slurm_env(slurm), timeout=900)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    preempted_dir = tmp_path / 'preempted'
    config = epoch_config(preempted_dir, seg_data, slow=0.5)
    work_dir, out = preempted_dir / 'run', tmp_path / 'job.out'
    env = slurm_env(slurm)
    script = tmp_path / 'job.sh'
    script.write_text(  # no --resume: the requeued job resumes by itself
        '#!/bin/bash\n'
        f'bash {ROOT}/tools/slurm_train.sh debug xcit-preempt {config} {work_dir}\n')
    job = subprocess.run(['sbatch', '--parsable', '--requeue', '--open-mode=append', '-o', str(out),
                          '-p', 'debug', '-n', '2', '--ntasks-per-node=2', '--cpus-per-task=1',
                          '--gres=gpu:2', str(script)], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    deadline = time.time() + 600
    while not re.search(r'Epoch\(train\) \[2\]\[1/4\]', out.read_text() if out.exists() else ''):
        assert time.time() < deadline, 'the job did not reach epoch 2'
        time.sleep(0.5)
    slurm.run('scancel', '--signal=USR1', job, check=True)
    requeued = False

    def finished() -> bool:
        """A final state; once the requeue was asked for, only the requeued attempt's: seen pending
        again, or its own log line written (while being requeued, a job can show FAILED with its
        Restarts already counted)."""
        if job_field(slurm, job, 'JobState') not in ('COMPLETED', 'FAILED', 'CANCELLED'):
            return False
        text = out.read_text()
        return requeued or 'Slurm requeue 1 of the group' in text or f'requeueing Slurm job {job}' not in text

    while not finished():
        assert time.time() < deadline, f'job {job} did not finish: {job_field(slurm, job, "JobState")}'
        if (not requeued and job_field(slurm, job, 'Restarts') == '1'
                and job_field(slurm, job, 'JobState') == 'PENDING'):
            # Slurm holds a requeued job back for a while; let it start now
            slurm.run('scontrol', 'update', f'jobid={job}', 'StartTime=now')
            requeued = True
        time.sleep(1)
    text = out.read_text()
    assert job_field(slurm, job, 'JobState') == 'COMPLETED', text[-3000:]
    assert job_field(slurm, job, 'Restarts') == '1'
    assert 'SIGUSR1 received: saving a checkpoint at iteration' in text
    assert f'requeueing Slurm job {job}' in text
    assert re.search(rf'checkpoint saved: \S*iter_\d+\.pth; stopping for the requeue of Slurm job {job}', text)
    saved = int(re.search(r'saving a checkpoint at iteration (\d+)', text).group(1))
    assert 4 < saved < 8, saved  # inside the second epoch
    assert f'resumed epoch: 1, iter: {saved}' in text
    assert re.search(rf'Slurm requeue 1 of the group \(SLURM_RESTART_COUNT\): resuming from \S*iter_{saved}\.pth', text)
    resumed = text.split('Slurm requeue 1 of the group', 1)[1]
    trained = re.findall(r'Epoch\(train\) \[2\]\[(\d)/4\]', resumed)
    assert trained == [str(i) for i in range(saved - 4 + 1, 5)], trained  # the epoch's rest, nothing again
    for rank in (0, 1):
        got = torch.load(work_dir / f'rank{rank}.pth', weights_only=True)
        want = torch.load(reference_dir / 'run' / f'rank{rank}.pth', weights_only=True)
        assert got.keys() == want.keys()
        worst = max((got[k].double() - want[k].double()).abs().max().item() for k in want)
        assert worst <= 1e-6, worst


def srun_env(cluster: slurm_cluster.PrivateSlurmCluster) -> str:
    """SLURM_CONF and CUDA_VISIBLE_DEVICES as seen by two tasks that srun starts on the cluster."""
    run = cluster.run('srun', '-p', 'debug', '--gres=gpu:2', '-n2', '--ntasks-per-node=2',
                      '--cpus-per-task=1', 'bash', '-c',
                      'echo "$SLURM_PROCID $SLURM_CONF $CUDA_VISIBLE_DEVICES"')
    assert run.returncode == 0, run.stderr + cluster.logs()
    return ''.join(sorted(run.stdout.splitlines(keepends=True)))


def test_second_private_cluster_coexists_and_stops_cleanly(slurm):
    """A second cluster on this host (same node name; own ports, munged and key) leaves the first alone."""
    other = slurm_cluster.PrivateSlurmCluster()
    try:
        other.start()
        assert (other.ctld_port, other.slurmd_port) != (slurm.ctld_port, slurm.slurmd_port)
        for cluster in (slurm, other):
            assert srun_env(cluster) == ''.join(f'{rank} {cluster.conf} 0,1\n' for rank in (0, 1))
    finally:
        leftovers = other.stop()
    assert not leftovers, f'processes of the second cluster outlived it: {leftovers}'
    assert not other.root.exists()
    assert set(slurm.daemon_pids()) == {'munged', 'slurmctld', 'slurmd'}
    assert srun_env(slurm).startswith(f'0 {slurm.conf} 0,1\n')
