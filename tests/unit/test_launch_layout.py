"""The launch layout from the environment (xcit_launch/launch_layout.py): the user's variables, a
Kubeflow PyTorchJob's (old and new training-operator v1) or TrainJob's (Trainer v2), and the
combinations refused; the master port check; and the launch scripts' use of it (tools/launch_common.sh)."""
import os
import socket
import subprocess
import sys

import pytest
from helpers import ROOT

from xcit_launch.launch_layout import Layout, launch_layout, main, master_port_taken

pytestmark = pytest.mark.quick

# the variables each operator sets in the pods of a job of 2 nodes, seen from the second (rank 1) one
OLD_V1 = dict(MASTER_ADDR='job-master-0', MASTER_PORT='23456', RANK='1', WORLD_SIZE='2')
NEW_V1 = dict(OLD_V1, PET_NNODES='2', PET_NODE_RANK='1', PET_NPROC_PER_NODE='auto',
              PET_MASTER_ADDR='job-master-0', PET_MASTER_PORT='23456')  # nprocPerNode left at its default
NEW_V1_8 = dict(NEW_V1, PET_NPROC_PER_NODE='8', WORLD_SIZE='16')  # nprocPerNode: 8
TRAINER_V2 = dict(PET_NNODES='2', PET_NODE_RANK='1', PET_NPROC_PER_NODE='auto',
                  PET_MASTER_ADDR='job-node-0-0.job', PET_MASTER_PORT='29400')
ELASTIC = dict(PET_RDZV_BACKEND='c10d', PET_RDZV_ENDPOINT='job-worker-0:23456', PET_MAX_RESTARTS='3')
USER = dict(NNODES='3', NODE_RANK='2', MASTER_ADDR='10.0.0.5', PORT='29511')
USER_SOURCES = dict(nnodes='NNODES', node_rank='NODE_RANK', master_addr='MASTER_ADDR', port='PORT')


@pytest.mark.parametrize('env, gpus, node_gpus, values, sources', [
    # plain launches: the defaults, then the user's variables
    ({}, 2, 0, (1, 0, '127.0.0.1', 29500), dict(nnodes='default', node_rank='default', master_addr='default',
                                                port='default', nproc_per_node='GPUS')),
    (USER, 8, 8, (3, 2, '10.0.0.5', 29511), dict(USER_SOURCES, nproc_per_node='GPUS')),
    (dict(NNODES='2'), 1, 0, (2, 0, '127.0.0.1', 29500), dict(nnodes='NNODES', node_rank='default')),
    # a stray MASTER_PORT or RANK without the rest of a PyTorchJob's variables is not one
    (dict(MASTER_PORT='1234', RANK='3'), 1, 0, (1, 0, '127.0.0.1', 29500), dict(port='default')),
    # training-operator v1 before 1.7: WORLD_SIZE counts the pods, RANK is the pod's index
    (OLD_V1, 8, 8, (2, 1, 'job-master-0', 23456),
     dict(nnodes='WORLD_SIZE', node_rank='RANK', master_addr='MASTER_ADDR', port='MASTER_PORT')),
    (dict(OLD_V1, RANK='0'), 1, 0, (2, 0, 'job-master-0', 23456), dict(node_rank='RANK')),
    # v1 1.7+: nprocPerNode auto (WORLD_SIZE counts pods) or a number (WORLD_SIZE counts processes)
    (NEW_V1, 8, 8, (2, 1, 'job-master-0', 23456),
     dict(nnodes='PET_NNODES', node_rank='PET_NODE_RANK', nproc_per_node='GPUS, as PET_NPROC_PER_NODE=auto')),
    (NEW_V1_8, 8, 8, (2, 1, 'job-master-0', 23456), dict(nproc_per_node='GPUS, as PET_NPROC_PER_NODE=8')),
    (dict(NEW_V1, PET_NPROC_PER_NODE='2', WORLD_SIZE='4'), 2, 0, (2, 1, 'job-master-0', 23456), {}),
    # an elasticPolicy beside a Master replica, of a fixed size n:n
    (dict(NEW_V1, **ELASTIC, PET_NNODES='2:2'), 8, 8, (2, 1, 'job-master-0', 23456), dict(nnodes='PET_NNODES')),
    # Trainer v2: the PET_ variables only
    (TRAINER_V2, 4, 4, (2, 1, 'job-node-0-0.job', 29400),
     dict(nnodes='PET_NNODES', node_rank='PET_NODE_RANK', master_addr='PET_MASTER_ADDR', port='PET_MASTER_PORT')),
    (dict(TRAINER_V2, PET_NPROC_PER_NODE='gpu'), 4, 4, (2, 1, 'job-node-0-0.job', 29400), {}),
    (dict(TRAINER_V2, PET_NPROC_PER_NODE='3'), 3, 0, (2, 1, 'job-node-0-0.job', 29400), {}),
    (dict(TRAINER_V2, PET_NPROC_PER_NODE='cpu'), 2, 0, (2, 1, 'job-node-0-0.job', 29400),
     dict(nproc_per_node='GPUS; PET_NPROC_PER_NODE=cpu')),
    (dict(TRAINER_V2, PET_NNODES='1', PET_NODE_RANK='0'), 1, 1, (1, 0, 'job-node-0-0.job', 29400), {}),
    # the user's variables win over either operator's
    (dict(NEW_V1_8, **USER), 8, 8, (3, 2, '10.0.0.5', 29511), USER_SOURCES),
    (dict(TRAINER_V2, **USER), 4, 4, (3, 2, '10.0.0.5', 29511), USER_SOURCES),
    (dict(OLD_V1, PORT='29600'), 1, 0, (2, 1, 'job-master-0', 29600), dict(port='PORT', node_rank='RANK')),
])
def test_the_layout_and_where_each_value_came_from(env, gpus, node_gpus, values, sources):
    layout = launch_layout(env, gpus, node_gpus)
    assert (layout.nnodes, layout.node_rank, layout.master_addr, layout.port, layout.nproc_per_node) == (*values, gpus)
    assert {key: layout.sources[key] for key in sources} == sources


@pytest.mark.parametrize('env, gpus, node_gpus, message', [
    # the launch scripts' own messages for the user's values
    (dict(NNODES='0'), 1, 0, "NNODES must be a positive integer, got '0'"),
    (dict(NNODES='2', NODE_RANK='2'), 1, 0, "NODE_RANK must be in 0..1, got '2'"),
    (dict(PORT='70000'), 1, 0, "PORT must be a port number (1-65535), got '70000'"),
    (dict(MASTER_ADDR='node0; touch x'), 1, 0, "MASTER_ADDR must be a host name or an address, got 'node0; touch x'"),
    (dict(MASTER_ADDR='-h'), 1, 0, "MASTER_ADDR must be a host name or an address, got '-h'"),
    # an elastic range, named
    (dict(NEW_V1, **ELASTIC, PET_NNODES='1:4'), 8, 8, 'PET_NNODES=1:4 is an elastic node range (the job\'s '
     'elasticPolicy minReplicas 1, maxReplicas 4)'),
    (dict(TRAINER_V2, PET_NNODES='two'), 4, 4, "PET_NNODES must be a positive integer, got 'two'"),
    # processes per node: the job's and the command line's
    (NEW_V1_8, 4, 8, 'GPUS=4 processes per node, but the job asks for PET_NPROC_PER_NODE=8: give the launch '
     'script the same number'),
    (NEW_V1, 4, 8, 'GPUS=4 processes per node, but the job asks for PET_NPROC_PER_NODE=auto (8, the GPUs of '
     'this node)'),
    (NEW_V1, 2, 0, 'PET_NPROC_PER_NODE=auto starts one process per GPU, but this node has no GPU'),
    (dict(TRAINER_V2, PET_NPROC_PER_NODE='gpu'), 2, 0, 'PET_NPROC_PER_NODE=gpu starts one process per GPU, but '
     'this node has no GPU'),
    (dict(TRAINER_V2, PET_NPROC_PER_NODE='cpu'), 2, 2, 'PET_NPROC_PER_NODE=cpu asks for CPU processes, but this '
     'node has 2 GPU(s)'),
    (dict(TRAINER_V2, PET_NPROC_PER_NODE='many'), 2, 2, "PET_NPROC_PER_NODE must be a positive integer, 'auto', "
     "'gpu' or 'cpu', got 'many'"),
    # WORLD_SIZE neither nodes x processes nor (nprocPerNode not a number) the pods
    (dict(NEW_V1, WORLD_SIZE='3'), 8, 8, "WORLD_SIZE=3 (the PyTorchJob's) is not nodes x processes per node = "
     '2 (PET_NNODES) x 8 (GPUS) nor the node count 2'),
    (dict(NEW_V1_8, WORLD_SIZE='2'), 8, 8, "WORLD_SIZE=2 (the PyTorchJob's) is not nodes x processes per node = "
     '2 (PET_NNODES) x 8 (GPUS)'),
    # a rank outside the job, and a job that does not tell a pod its rank or the master
    (dict(TRAINER_V2, PET_NODE_RANK='2'), 4, 4, "PET_NODE_RANK must be in 0..1, got '2' (2 node(s) from PET_NNODES)"),
    (dict(ELASTIC, PET_NNODES='2:2'), 1, 0, "PET_NNODES=2:2 nodes, but no variable gives this pod's node rank "
     '(NODE_RANK, PET_NODE_RANK) or master (MASTER_ADDR, PET_MASTER_ADDR): set them'),
    ({k: v for k, v in TRAINER_V2.items() if k != 'PET_NODE_RANK'}, 4, 4, "PET_NNODES=2 nodes, but no variable "
     "gives this pod's node rank (NODE_RANK, PET_NODE_RANK): set them"),
    (dict(TRAINER_V2, PET_MASTER_PORT='0'), 4, 4, "PET_MASTER_PORT must be a port number (1-65535), got '0'"),
])
def test_values_that_disagree_or_cannot_be_used_are_refused(env, gpus, node_gpus, message):
    with pytest.raises(ValueError) as caught:
        launch_layout(env, gpus, node_gpus)
    assert message in str(caught.value)


def test_the_log_line_names_each_source():
    sources = dict(nnodes='PET_NNODES', node_rank='RANK', master_addr='MASTER_ADDR', port='MASTER_PORT',
                   nproc_per_node='GPUS')
    layout = Layout(2, 1, 'job-master-0', 23456, 8, 0, dict(sources, max_restarts='default'))
    assert layout.describe() == ('launch layout: 2 node(s) (PET_NNODES), node rank 1 (RANK), master job-master-0 '
                                 '(MASTER_ADDR) port 23456 (MASTER_PORT), 8 process(es) per node (GPUS)')
    layout = Layout(2, 1, 'job-master-0', 23456, 8, 3, dict(sources, max_restarts='PET_MAX_RESTARTS'))
    assert layout.describe().endswith('8 process(es) per node (GPUS), 3 restart(s) (PET_MAX_RESTARTS)')


@pytest.mark.parametrize('env, restarts, source', [
    ({}, 0, 'default'), (TRAINER_V2, 0, 'default'), (dict(MAX_RESTARTS='2'), 2, 'MAX_RESTARTS'),
    (dict(NEW_V1, **ELASTIC, PET_NNODES='2:2'), 3, 'PET_MAX_RESTARTS'),  # an elastic policy's maxRestarts
    (dict(NEW_V1, **ELASTIC, MAX_RESTARTS='0'), 0, 'MAX_RESTARTS'),  # the user's value wins
])
def test_the_restarts_are_the_users_else_the_elastic_policys(env, restarts, source):
    layout = launch_layout(env, 8, 8)
    assert (layout.max_restarts, layout.sources['max_restarts']) == (restarts, source)


def test_restarts_that_are_not_a_count_are_refused():
    with pytest.raises(ValueError, match="PET_MAX_RESTARTS must be a non-negative integer, got '-1'"):
        launch_layout(dict(TRAINER_V2, PET_MAX_RESTARTS='-1'), 4, 4)


@pytest.mark.parametrize('env, gpus, logged', [
    ({}, 1, False), (USER, 1, False), (dict(MASTER_ADDR='node0', NNODES='2'), 1, False),
    (OLD_V1, 1, True), (TRAINER_V2, 4, True), (dict(NEW_V1_8, **USER), 8, True),  # GPUS as PET_NPROC_PER_NODE
])
def test_the_log_line_is_for_launches_a_job_placed(env, gpus, logged):
    assert launch_layout(env, gpus, gpus).from_a_job() is logged


def test_the_port_is_checked_only_on_this_machine():
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert master_port_taken('127.0.0.1', port)
        assert not master_port_taken('192.0.2.1', port)  # TEST-NET-1: never this machine's (a pod's remote master)
    assert not master_port_taken('127.0.0.1', port)


def test_main_prints_the_layout_or_one_error(monkeypatch, capsys):
    for name in list(os.environ):
        if name in USER or name in NEW_V1 or name.startswith('PET_'):
            monkeypatch.delenv(name)
    for name, value in TRAINER_V2.items():
        monkeypatch.setenv(name, value)
    assert main(['4', '4']) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('launch layout: 2 node(s)') and out[1:] == ['2', '1', 'job-node-0-0.job', '29400', '0']
    monkeypatch.setenv('PET_NNODES', '1:2')
    assert main(['4', '4']) == 2
    assert capsys.readouterr().err.startswith('error: PET_NNODES=1:2 is an elastic node range')
    for name in TRAINER_V2:
        monkeypatch.delenv(name)
    monkeypatch.setenv('NNODES', '2')
    monkeypatch.setenv('NODE_RANK', '1')  # (node 0 would check port 29500 on this machine)
    assert main(['4', '4']) == 0
    assert capsys.readouterr().out.splitlines() == ['', '2', '1', '127.0.0.1', '29500', '0']  # the user's: no log line


PLAIN_ARGS = ['--nnodes=2', '--nproc_per_node={gpus}', '--node_rank=1', '--master_addr=10.0.0.5',
              '--master_port=29511', '--rdzv-conf=timeout=600']
JOB_ARGS = ['launch layout: 2 node(s) (PET_NNODES), node rank 1 (PET_NODE_RANK), master job-node-0-0.job '
            '(PET_MASTER_ADDR) port 29400 (PET_MASTER_PORT), {gpus} process(es) per node (GPUS; '
            'PET_NPROC_PER_NODE=cpu)',
            '--nnodes=2', '--nproc_per_node={gpus}', '--node_rank=1', '--master_addr=job-node-0-0.job',
            '--master_port=29400', '--rdzv-conf=timeout=600']


@pytest.mark.parametrize('job, gpus, threads', [(True, 2, '1'), (True, 1, 'unset'), (False, 2, '1')])
def test_the_launch_scripts_take_the_layout_and_hand_torchrun_no_operator_variable(job, gpus, threads):
    """tools/launch_common.sh as dist_train.sh runs it, in a Trainer v2 pod of a CPU node, and on a plain
    node (the user's variables, no log line: its output as before). The GPU count, torch's, is given as
    the unit tests above give it: importing torch would take seconds. OpenMP's threads as torchrun sets
    them (one per process of several), so that torchrun prints no banner."""
    script = ('set -euo pipefail; source tools/launch_common.sh; node_gpus() { echo 0; }; '
              f'GPUS={gpus}; torchrun_layout; torchrun_args; printf "%s\\n" "${{TORCHRUN_ARGS[@]}}"; '
              'env | grep ^PET_ || true; echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"; '
              'echo "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$TORCH_ELASTIC_SHUTDOWN_TIMEOUT"')
    env = {k: v for k, v in os.environ.items() if k not in USER and k not in NEW_V1 and k != 'OMP_NUM_THREADS'
           and not k.startswith('PET_')}
    env.update(dict(TRAINER_V2, PET_NPROC_PER_NODE='cpu', PET_STANDALONE='', PET_RDZV_BACKEND='c10d') if job
               else dict(USER, NNODES='2', NODE_RANK='1'), PYTHON=sys.executable)
    proc = subprocess.run(['bash', '-c', script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    expected = [line.format(gpus=gpus) for line in (JOB_ARGS if job else PLAIN_ARGS)]
    assert proc.stdout.splitlines() == [*expected, f'OMP_NUM_THREADS={threads}', 'TORCH_ELASTIC_SHUTDOWN_TIMEOUT=90']
