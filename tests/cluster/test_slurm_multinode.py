"""tools/slurm_train.sh and slurm_test.sh on a multi-node Slurm cluster: slurmctld and a slurmd per
node, each in a network namespace of its own with its own address (tests/support/slurm_netns.py); and a
requeued job that loses a node mid-run and finishes on the nodes left."""
import contextlib
import re
import subprocess
from typing import Iterator

import pytest
import torch

import netns
import slurm_cluster
import slurm_netns
from helpers import (ROOT, assert_matches, env, rank_weights, read_log, report, require_capability, sgd_config,
                     spawned, wait_for)

pytestmark = pytest.mark.cluster


@contextlib.contextmanager
def slurm_on_hosts(nodes: int, **cluster_options: int) -> Iterator[slurm_netns.NamespacedSlurmCluster]:
    """A controller host and ``nodes`` compute hosts; the daemons, jobs and namespaces are gone
    afterwards (checked), also when the test fails."""
    require_capability('slurm', not slurm_cluster.missing_reason(), slurm_cluster.missing_reason())
    require_capability('netns', not netns.missing_reason(), netns.missing_reason())
    with netns.private_hosts(1 + nodes) as net:
        with slurm_cluster.running(slurm_netns.NamespacedSlurmCluster(net, **cluster_options)) as cluster:
            yield cluster
    assert not netns.namespaces_left(net)


@pytest.fixture(scope='module')
def two_node_slurm() -> Iterator[slurm_netns.NamespacedSlurmCluster]:
    with slurm_on_hosts(2) as cluster:
        yield cluster


def on_login_node(cluster: slurm_netns.NamespacedSlurmCluster, *args, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(cluster.command(cluster.ctl, *map(str, args)),
                          env=env(SLURM_CONF=cluster.env['SLURM_CONF'], **extra),
                          capture_output=True, text=True, timeout=900)


def test_two_nodes_two_tasks_each_train_then_test(two_node_slurm, tmp_path, seg_data):
    cluster = two_node_slurm
    node1, node2 = cluster.nodes
    config = sgd_config(tmp_path, seg_data)
    work_dir = tmp_path / 'run'
    layout = dict(GPUS=4, GPUS_PER_NODE=2, CPUS_PER_TASK=1)  # no PORT: the job id gives it
    train = on_login_node(cluster, 'bash', ROOT / 'tools/slurm_train.sh', 'debug', 'xcit-2n', config, work_dir,
                          **layout)
    out = train.stdout + train.stderr
    assert train.returncode == 0, out[-4000:] + cluster.logs()
    job = re.search(r'Slurm job (\d+) on node\[1-2\]: master node1 \(the first host: node1\), port (\d+) '
                    r'\(from the job id\)', out)
    assert job, out[-4000:]
    assert int(job.group(2)) == 20000 + int(job.group(1)) % 10000
    log = read_log(work_dir)
    report(log)
    assert f'Run plan: 2 node(s), 4 processes, backend gloo on eth0 {node1.address} (GLOO_SOCKET_IFNAME ' \
           f'chosen: the route to MASTER_ADDR {node1.address}); world size 4' in log
    # each node advertises its own address
    assert f'(node 1): gloo on eth0 {node2.address}' in out and f'(node 0): gloo on eth0 {node1.address}' in out
    assert re.search(r'Iter\(train\) \[2/2\]', log) and 'img_per_s' in log
    rank_weights(work_dir, 4)
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
