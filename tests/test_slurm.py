"""The Slurm launch scripts on a real one-host Slurm cluster: train, test, preemption + requeue."""
import re
import subprocess
import time

import pytest

import slurm_cluster
from conftest import ROOT
from test_launch import free_port, hooked_config, launch_env, read_log


@pytest.fixture(scope='module')
def slurm():
    reason = slurm_cluster.missing_reason()
    if reason:
        print(f'\nSKIPPING the Slurm tests: {reason}')
        pytest.skip(reason)
    return slurm_cluster.start_cluster()


def slurm_env(**extra):
    return launch_env(GPUS=2, GPUS_PER_NODE=2, CPUS_PER_TASK=1, PORT=free_port(), **extra)


def test_slurm_train_then_slurm_test(slurm, tmp_path, seg_data):
    config = hooked_config(tmp_path, seg_data)
    work_dir = tmp_path / 'run'
    train = subprocess.run(['bash', str(ROOT / 'tools/slurm_train.sh'), 'debug', 'xcit-train', str(config),
                            str(work_dir)], cwd=tmp_path, env=slurm_env(), capture_output=True, text=True,
                           timeout=900)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    log = read_log(work_dir)
    assert 'Run plan: 1 node(s), 2 processes, backend gloo; world size 2' in log
    assert 'img_per_s' in log
    test = subprocess.run(['bash', str(ROOT / 'tools/slurm_test.sh'), 'debug', 'xcit-test', str(config),
                           str(work_dir / 'iter_4.pth'), '--work-dir', str(tmp_path / 'eval')],
                          cwd=tmp_path, env=slurm_env(), capture_output=True, text=True, timeout=900)
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]
    assert re.search(r'mIoU: \d', test.stdout + test.stderr)


def job_field(job: str, field: str) -> str:
    out = subprocess.run(['scontrol', 'show', 'job', job], capture_output=True, text=True).stdout
    match = re.search(rf'\b{field}=(\S+)', out)
    return match.group(1) if match else ''


def test_preemption_checkpoints_requeues_and_finishes(slurm, tmp_path, seg_data):
    config = hooked_config(tmp_path, seg_data, max_iters=12, slow=0.5, interval=12)
    work_dir, out = tmp_path / 'run', tmp_path / 'job.out'
    env = slurm_env()
    script = tmp_path / 'job.sh'
    script.write_text(
        '#!/bin/bash\n'
        f'bash {ROOT}/tools/slurm_train.sh debug xcit-preempt {config} {work_dir} --resume\n')
    job = subprocess.run(['sbatch', '--parsable', '--requeue', '--open-mode=append', '-o', str(out),
                          '-p', 'debug', '-n', '2', '--ntasks-per-node=2', '--cpus-per-task=1',
                          '--gres=gpu:2', str(script)], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    deadline = time.time() + 600
    while not re.search(r'Iter\(train\) \[\s*3/12\]', out.read_text() if out.exists() else ''):
        assert time.time() < deadline, 'the job did not reach iteration 3'
        time.sleep(0.5)
    subprocess.run(['scancel', '--signal=USR1', job], check=True)
    requeued = False
    while job_field(job, 'JobState') not in ('COMPLETED', 'FAILED', 'CANCELLED'):
        assert time.time() < deadline, f'job {job} did not finish: {job_field(job, "JobState")}'
        if not requeued and job_field(job, 'Restarts') == '1' and job_field(job, 'JobState') == 'PENDING':
            # Slurm holds a requeued job back for a while; let it start now
            subprocess.run(['scontrol', 'update', f'jobid={job}', 'StartTime=now'], capture_output=True)
            requeued = True
        time.sleep(1)
    text = out.read_text()
    assert job_field(job, 'JobState') == 'COMPLETED', text[-3000:]
    assert job_field(job, 'Restarts') == '1'
    assert 'SIGUSR1 received: saving a checkpoint at iteration' in text
    assert f'requeueing Slurm job {job}' in text
    saved = int(re.search(r'saving a checkpoint at iteration (\d+)', text).group(1))
    assert f'resumed epoch: 0, iter: {saved}' in text
    assert re.search(r'Iter\(train\) \[12/12\]', text)
    assert (work_dir / 'iter_12.pth').exists()
