"""Scale-out on separate hosts: torchrun nodes in network namespaces (own interfaces and
addresses), a node that never joins, and elastic restarts after a worker is killed."""
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Iterator, List

import netns
import pytest
import torch
from helpers import ROOT, assert_matches, env, rank_weights, read_log, report, require_capability, sgd_config

pytestmark = pytest.mark.cluster

@pytest.fixture(scope='module')
def hosts_possible() -> None:
    reason = netns.missing_reason()
    require_capability('netns', not reason, reason)


@pytest.fixture
def two_hosts(hosts_possible) -> Iterator[netns.Network]:
    """Two hosts joined by a veth pair; gone after the test (checked), also when it fails."""
    with netns.private_hosts(2) as net:
        yield net
    assert not netns.namespaces_left(net)


def start_nodes(net: netns.Network, config: Path, work_dir: Path, per_node: int, master: str,
                hosts_file: bool = False, started: int = 2, args: List[str] = (),
                **extra: object) -> List[subprocess.Popen]:
    """tools/dist_train.sh on the first ``started`` of the 2 hosts (NNODES=2, NODE_RANK = host index)."""
    return [subprocess.Popen(
        net.command(host, ['bash', ROOT / 'tools/dist_train.sh', config, per_node, '--work-dir', work_dir,
                           *args], hosts_file=hosts_file),
        cwd=config.parent, env=env(NNODES=2, NODE_RANK=rank, MASTER_ADDR=master, PORT=29500, **extra),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank, host in enumerate(net.hosts[:started])]


def finish(net: netns.Network, procs: List[subprocess.Popen], timeout: float = 600) -> List[str]:
    """The outputs of ``procs`` once they have ended, each beginning with its exit status
    ('exit N'). Past ``timeout`` every process in the namespaces is killed (workers too: they hold
    the output pipes)."""
    outputs = []
    for proc in procs:
        try:
            out = proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            for pid in net.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out = proc.communicate()[0] + '\n[test: killed after the timeout]'
            timeout = 1
        outputs.append(f'exit {proc.returncode}\n{out}')
    return outputs


def all_succeeded(outputs: List[str]) -> None:
    assert all(out.startswith('exit 0\n') for out in outputs), '\n'.join(o[-3000:] for o in outputs)


def test_two_hosts_world_four_matches_one_process(two_hosts, tmp_path, seg_data, one_process_reference):
    """Node 0 and node 1 on separate network stacks, 2 processes each; the host name resolves to
    loopback on both, so gloo must be told which address its peers can reach."""
    net = two_hosts
    node0, node1 = net.hosts
    config = sgd_config(tmp_path, seg_data)
    work_dir = tmp_path / 'run'
    outputs = finish(net, start_nodes(net, config, work_dir, 2, node0.address))
    all_succeeded(outputs)
    log = read_log(work_dir)
    report(log)
    route = f'(GLOO_SOCKET_IFNAME chosen: the route to MASTER_ADDR {node0.address})'
    assert f'Run plan: 2 node(s), 4 processes, backend gloo on eth0 {node0.address} {route}; world size 4, ' \
           f'2 images per GPU, accumulation 1, effective batch 8' in log
    assert f'(node 1): gloo on eth0 {node1.address} {route}' in outputs[1]
    assert 'img_per_s' in log and re.search(r'Iter\(train\) \[2/2\]', log)
    weights = rank_weights(work_dir, 4)
    assert_matches(weights[0], one_process_reference)


def test_master_by_host_name_from_a_private_hosts_file(two_hosts, tmp_path, seg_data):
    """MASTER_ADDR=node0, resolved through a hosts file that only the nodes' processes see."""
    net = two_hosts
    node0, node1 = net.hosts
    assert 'node0' not in Path('/etc/hosts').read_text()
    config = sgd_config(tmp_path, seg_data, steps=1)
    work_dir = tmp_path / 'run'
    outputs = finish(net, start_nodes(net, config, work_dir, 1, 'node0', hosts_file=True))
    all_succeeded(outputs)
    log = read_log(work_dir)
    report(log)
    assert f'Run plan: 2 node(s), 2 processes, backend gloo on eth0 {node0.address} (GLOO_SOCKET_IFNAME ' \
           f'chosen: the route to MASTER_ADDR {node0.address}); world size 2' in log
    assert f'(node 1): gloo on eth0 {node1.address}' in outputs[1]
    rank_weights(work_dir, 2)
    assert 'node0' not in Path('/etc/hosts').read_text()  # the host's file was never touched


@pytest.mark.parametrize('restarts', [0, 1])
def test_a_node_that_never_joins_stops_the_other_naming_the_rendezvous(two_hosts, tmp_path, seg_data,
                                                                        restarts):
    """NNODES=2, only node 0 started: it stops after RDZV_TIMEOUT, naming the rendezvous."""
    node0 = two_hosts.hosts[0]
    config = sgd_config(tmp_path, seg_data)
    (proc,) = start_nodes(two_hosts, config, tmp_path / 'run', 1, node0.address, started=1,
                          RDZV_TIMEOUT=8, MAX_RESTARTS=restarts)
    out = finish(two_hosts, [proc], timeout=240)[0]
    print(out.splitlines()[-1])
    assert out.startswith('exit 1\n'), out[-3000:]
    backend = 'c10d' if restarts else 'static'
    assert re.search(rf'error: the {backend} rendezvous at {re.escape(node0.address)}:29500 did not complete: '
                     rf'2 node\(s\) expected, waited RDZV_TIMEOUT=8 s \(', out), out[-3000:]
    assert not (tmp_path / 'run').exists()  # no worker ever started


def test_elastic_restart_resumes_and_ends_like_an_uninterrupted_run(two_hosts, tmp_path, seg_data,
                                                                    one_process_reference):
    """MAX_RESTARTS=1, one process per node, 2 images x accumulation 2 (effective batch 8): rank 1
    kills itself after micro-iteration 3 (a checkpoint after 2); the agents restart the group, which
    resumes from iter_2 by itself and ends with the weights of the uninterrupted one-process run."""
    net = two_hosts
    node0 = net.hosts[0]
    config = sgd_config(tmp_path, seg_data, hooks=[dict(type='KillOnFirstAttemptHook', rank=1, after_iter=3)])
    work_dir = tmp_path / 'run'
    outputs = finish(net, start_nodes(net, config, work_dir, 1, node0.address, args=['--accumulation', '2'],
                                 MAX_RESTARTS=1, RDZV_TIMEOUT=120))
    all_succeeded(outputs)
    text = '\n'.join(outputs)
    assert (work_dir / 'killed_rank1').exists(), text[-3000:]
    log = read_log(work_dir)
    report(log)
    assert re.search(r'elastic restart 1 of the group \(torchrun --max-restarts\): resuming from \S*iter_2\.pth',
                     text + log), text[-4000:]
    assert 'resumed epoch: 0, iter: 2' in text + log
    assert re.search(r'Iter\(train\) \[4/4\]', text + log)
    checkpoint = torch.load(work_dir / 'iter_4.pth', weights_only=False)
    assert checkpoint['meta']['iter'] == 4
    weights = rank_weights(work_dir, 2)
    assert_matches(weights[0], one_process_reference)
    assert_matches(checkpoint['state_dict'], one_process_reference)
