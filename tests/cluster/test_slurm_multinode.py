"""tools/slurm_train.sh and slurm_test.sh on a multi-node Slurm cluster: slurmctld and a slurmd per
node, each in a network namespace of its own with its own address (tests/support/slurm_netns.py):
nodes whose own names resolve to a loopback address, a peer that stops mid-run and the resume; and
a requeued job that loses a node mid-run and finishes on the nodes left."""
import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import netns
import pytest
import slurm_cluster
import slurm_netns
import torch
from helpers import (
    ROOT,
    assert_matches,
    env,
    rank_weights,
    read_log,
    report,
    require_capability,
    sgd_config,
    spawned,
    wait_for,
)

pytestmark = pytest.mark.cluster


STEP_TIMEOUT = 10  # XCIT_STEP_TIMEOUT of the run that loses a peer


@contextlib.contextmanager
def slurm_on_hosts(nodes: int, own_name_loopback: bool = False, prefix: str = netns.PREFIX,
                   **cluster_options: int) -> Iterator[slurm_netns.NamespacedSlurmCluster]:
    """A controller host and ``nodes`` compute hosts; the daemons, jobs and namespaces are gone
    afterwards (checked), also when the test fails."""
    require_capability('slurm', not slurm_cluster.missing_reason(), slurm_cluster.missing_reason())
    require_capability('netns', not netns.missing_reason(), netns.missing_reason())
    with netns.private_hosts(1 + nodes, own_name_loopback, prefix) as net:
        with slurm_cluster.running(slurm_netns.NamespacedSlurmCluster(net, **cluster_options)) as cluster:
            yield cluster
    assert not netns.namespaces_left(net)


@pytest.fixture(scope='module')
def two_node_slurm() -> Iterator[slurm_netns.NamespacedSlurmCluster]:
    """Two compute hosts set up as Debian does: each maps its own name to 127.0.1.1. Their addresses
    sort above it (198.18.S.x), as 172.16/12 and 192.168/16 addresses do: gloo's side of a pair with
    the larger address connects, so the other nodes connect to what node 0 advertises."""
    with slurm_on_hosts(2, own_name_loopback=True, prefix='198.18') as cluster:
        yield cluster


def on_login_node(cluster: slurm_netns.NamespacedSlurmCluster, *args, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(cluster.command(cluster.ctl, *map(str, args)),
                          env=env(SLURM_CONF=cluster.env['SLURM_CONF'], **extra),
                          capture_output=True, text=True, timeout=900)


def lose_a_peer(cluster: slurm_netns.NamespacedSlurmCluster, launch: List[str], work_dir: Path, rank: int,
                output: Path, **extra: object) -> Tuple[int, float, float]:
    """Run ``launch`` until rank ``rank`` has stopped itself (StopOnFirstAttemptHook) and the job has
    ended; returns the stopped pid and the seconds from the stop until the first report of a lost
    peer and until the job's end. The stopped process is continued (so that it can be ended) and
    the job cancelled, also when the run or the test fails."""
    stopped, pid, named, ended = work_dir / f'stopped_rank{rank}', 0, float('inf'), float('inf')
    with output.open('w') as out, spawned(launch, env=env(SLURM_CONF=cluster.env['SLURM_CONF'], **extra),
                                          stdout=out, stderr=subprocess.STDOUT) as proc:
        try:
            try:
                wait_for(stopped, proc, timeout=600)  # a loaded machine starts 4 ranks slowly
            except AssertionError as exc:
                raise AssertionError(f'{exc}\n{output.read_text()[-4000:]}\n{cluster.logs()}') from None
            pid, at = int(stopped.read_text().split()[0]), float(stopped.read_text().split()[1])
            while 'lost its peers' not in output.read_text() and proc.poll() is None \
                    and time.time() < at + STEP_TIMEOUT + 120:
                time.sleep(0.2)
            named = time.time() - at
            proc.wait(timeout=180)
            ended = time.time() - at
        finally:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            cluster.cancel_jobs()
    return pid, named, ended


def test_debian_hosts_lose_a_stopped_peer_resume_then_test(two_node_slurm, tmp_path, seg_data,
                                                           one_process_reference):
    """2 tasks on each of 2 nodes whose own names resolve to 127.0.1.1 there. Rank 2 (on node2)
    stops (SIGSTOP: a hang, as a lost peer shows on NCCL) as iteration 2 begins, after the
    checkpoint of iteration 1: the others end within XCIT_STEP_TIMEOUT plus a margin, naming rank 2
    and --resume. The resumed run ends with the uninterrupted one-process run's weights, and
    slurm_test.sh evaluates its checkpoint."""
    cluster = two_node_slurm
    node1, node2 = cluster.nodes
    config = sgd_config(tmp_path, seg_data, hooks=[dict(type='StopOnFirstAttemptHook', rank=2, at_iter=2)])
    work_dir = tmp_path / 'run'
    layout = dict(GPUS=4, GPUS_PER_NODE=2, CPUS_PER_TASK=1)  # no PORT: the job id gives it
    train = cluster.command(cluster.ctl, 'bash', ROOT / 'tools/slurm_train.sh', 'debug', 'xcit-2n', config, work_dir)
    pid, named, ended = lose_a_peer(cluster, train, work_dir, 2, tmp_path / 'lost.out', XCIT_STEP_TIMEOUT=STEP_TIMEOUT,
                             **layout)
    out = (tmp_path / 'lost.out').read_text()
    reports = re.findall(r'error: rank (\d) lost its peers: a collective failed \(Timed out waiting \d+ms[^)]*\); '
                         r'gone: (.*?)\. The checkpoints already written are complete: continue with --resume\.', out)
    print(f'rank 2 stopped; ranks {[r for r, _ in reports]} named it, the first after {named:.1f} s, the job '
          f'ended after {ended:.1f} s (XCIT_STEP_TIMEOUT={STEP_TIMEOUT})')
    # every survivor that reports before the launcher ends the job names rank 2, the first within the
    # step bound plus the 10 s the survivors wait for each other's reports
    assert reports, out[-4000:] + cluster.logs()
    assert all(re.fullmatch(rf'rank 2 \(\S+ pid {pid}\)', gone) for _, gone in reports), reports
    assert named < STEP_TIMEOUT + 25 and ended < 2 * STEP_TIMEOUT + 60, out[-4000:]
    assert 'srun: error' in out and not (work_dir / 'iter_2.pth').exists(), out[-4000:]
    job = re.search(r'Slurm job (\d+) on node\[1-2\]: master node1 \(the first host: node1\), port (\d+) '
                    r'\(from the job id\)', out)
    assert job, out[-4000:]
    assert int(job.group(2)) == 20000 + int(job.group(1)) % 10000
    # each node advertises its own subnet address, found through the other node's name
    assert f'(node 0): gloo on eth0 {node1.address} (GLOO_SOCKET_IFNAME chosen: the route to node2 ' \
           f'{node2.address})' in out, out[-4000:]
    assert f'(node 1): gloo on eth0 {node2.address} (GLOO_SOCKET_IFNAME chosen: the route to MASTER_ADDR ' \
           f'{node1.address})' in out, out[-4000:]

    resume = on_login_node(cluster, 'bash', ROOT / 'tools/slurm_train.sh', 'debug', 'xcit-2n', config, work_dir,
                           '--resume', **layout)
    out = resume.stdout + resume.stderr
    assert resume.returncode == 0, out[-4000:] + cluster.logs()
    log = read_log(work_dir)
    report(log)
    assert f'Run plan: 2 node(s), 4 processes, backend gloo on eth0 {node1.address} (GLOO_SOCKET_IFNAME ' \
           f'chosen: the route to node2 {node2.address}); world size 4' in log
    assert 'resumed epoch: 0, iter: 1' in log, log[-4000:]
    assert log.count('Iter(train) [1/2]') == 1 and log.count('Iter(train) [2/2]') == 1, log[-4000:]
    assert 'img_per_s' in log
    weights = rank_weights(work_dir, 4)
    assert_matches(weights[0], one_process_reference)
    test = on_login_node(cluster, 'bash', ROOT / 'tools/slurm_test.sh', 'debug', 'xcit-2n-test', config,
                         work_dir / 'iter_2.pth', '--work-dir', tmp_path / 'eval', **layout)
    out = test.stdout + test.stderr
    assert test.returncode == 0, out[-4000:]
    plan = re.search(r'Test plan: [^\n]*', out)
    print(plan.group(0) if plan else out[-2000:])
    assert plan and plan.group(0).startswith('Test plan: 2 node(s), 4 processes, backend gloo on eth0')
    assert re.search(r'mIoU: \d', out)


def test_requeued_job_loses_a_node_and_finishes_on_the_nodes_left(tmp_path, seg_data, one_process_reference):
    """REQUEUE=1, 2 tasks on each of 2 of the 3 nodes: after the checkpoint of iteration 1, rank 2
    (on node2) stops and node2 loses power. The controller sets it DOWN (SlurmdTimeout 5 s) and
    requeues the job, which runs again on node1 and the spare node3, resumes from iter_1 by itself
    and ends at iteration 2 with the weights of the uninterrupted one-process run."""
    config = sgd_config(tmp_path, seg_data, hooks=[dict(type='HangOnFirstAttemptHook', rank=2, after_iter=1)])
    work_dir = tmp_path / 'run'
    with slurm_on_hosts(3, slurmd_timeout=5, cred_expire=10) as cluster:
        node1, node2, node3 = cluster.nodes
        launch = cluster.command(cluster.ctl, 'bash', ROOT / 'tools/slurm_train.sh', 'debug', 'xcit-requeue', config,
                                 work_dir)
        layout = dict(GPUS=4, GPUS_PER_NODE=2, CPUS_PER_TASK=1, REQUEUE=1,
                      SLURM_OUTPUT=tmp_path / 'slurm-%j.out')
        with spawned(launch, env=env(SLURM_CONF=cluster.env['SLURM_CONF'], **layout), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True) as proc:
            wait_for(work_dir / 'hung_rank2', proc)
            wait_for(work_dir / 'iter_1.pth', proc)
            hung = int((work_dir / 'hung_rank2').read_text())
            assert hung in cluster.net.host_pids(node2), 'rank 2 is not on node2'
            cluster.net.power_off(node2)
            submitted = proc.communicate(timeout=420)[0]
        (output,) = tmp_path.glob('slurm-*.out')
        out = output.read_text()
        assert proc.returncode == 0, submitted + out[-4000:] + cluster.logs()
        job = re.search(r'Submitted batch job (\d+)', submitted).group(1)
        info = cluster.run('scontrol', 'show', 'job', job).stdout
        print(' '.join(w for w in info.split() if w.split('=')[0] in ('JobId', 'JobState', 'Restarts', 'NodeList')))
        assert 'JobState=COMPLETED' in info and 'Restarts=1' in info and ' NodeList=node[1,3]' in info, info
        assert cluster.node_states()['node2'].startswith('down'), cluster.node_states()
    first, second = re.findall(rf'Slurm job {job} on (\S+): master (\S+)', out)
    assert first == ('node[1-2]', 'node1') and second == ('node[1,3]', 'node1'), out[-4000:]
    log = read_log(work_dir)
    report(log)
    assert re.search(r'Slurm requeue 1 of the group \(SLURM_RESTART_COUNT\): resuming from \S*iter_1\.pth', log), \
        log[-4000:]
    assert log.count('Iter(train) [1/2]') == 1 and log.count('Iter(train) [2/2]') == 1, log[-4000:]  # not retrained
    assert torch.load(work_dir / 'iter_2.pth', weights_only=False)['meta']['iter'] == 2
    weights = rank_weights(work_dir, 4)
    assert_matches(weights[0], one_process_reference)
