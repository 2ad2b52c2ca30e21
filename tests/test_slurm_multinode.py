"""tools/slurm_train.sh and slurm_test.sh on a two-node Slurm cluster: slurmctld and two slurmds,
each in a network namespace of its own with its own address (tests/slurm_netns.py)."""
import re
import subprocess
from typing import Iterator

import pytest

import netns
import slurm_cluster
import slurm_netns
from helpers import ROOT, env, rank_weights, read_log, report, require_capability, sgd_config

pytestmark = pytest.mark.cluster


@pytest.fixture(scope='module')
def two_node_slurm() -> Iterator[slurm_netns.NamespacedSlurmCluster]:
    require_capability('slurm', not slurm_cluster.missing_reason(), slurm_cluster.missing_reason())
    require_capability('netns', not netns.missing_reason(), netns.missing_reason())
    with netns.private_hosts(3) as net:
        cluster = slurm_netns.NamespacedSlurmCluster(net)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.cancel_jobs()
            leftovers = cluster.stop()
    assert not leftovers, f'processes of the private cluster outlived it: {leftovers}'
    assert not netns.namespaces_left(net)


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
