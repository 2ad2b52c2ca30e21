"""The pieces of the scale-out launch that need no processes: single or multi-node from the launcher's
counts, the route to another node, the torchrun wrapper's options and rendezvous report, the Slurm
job's port."""
import socket

import pytest
import torch.distributed as dist
from helpers import require_capability

from xcit_dense.engine.distributed.process_group import job_port
from xcit_launch import netif, torchrun as torchrun_tool


def test_route_to_loopback_is_lo():
    assert netif.route_to('127.0.0.1') == netif.Route('127.0.0.1', '127.0.0.1', 'lo')
    assert netif.is_loopback('localhost') and netif.is_loopback('127.0.0.1')


def local_addresses():
    return [(name, netif._ipv4_of(name)) for _, name in socket.if_nameindex()
            if netif._ipv4_of(name) and not netif._ipv4_of(name).startswith('127.')]


def test_route_to_an_own_address_names_its_interface():
    found = local_addresses()
    require_capability('ipv4', bool(found), 'this machine has no non-loopback IPv4 address')
    name, address = found[0]
    assert netif.route_to(address) == netif.Route(address, address, name)


def test_reaching_route_skips_names_that_resolve_to_loopback_here():
    """Node 0's own name maps to 127.0.1.1 on node 0 (Debian): the next target, another node, is used;
    with no target left, the error names each one and what it resolved to."""
    found = local_addresses()
    require_capability('ipv4', bool(found), 'this machine has no non-loopback IPv4 address')
    name, address = found[0]
    assert netif.reaching_route(['127.0.1.1', address]) == (address, netif.Route(address, address, name))
    with pytest.raises(OSError, match=r'no other node reachable: localhost resolves to 127\.0\.0\.1 on this node '
                                      r'\(a loopback address\); 127\.0\.1\.1 resolves to 127\.0\.1\.1 .*; '
                                      r'no-such-host\.invalid: '):
        netif.reaching_route(['localhost', '127.0.1.1', 'no-such-host.invalid'])


@pytest.mark.parametrize('variables, nodes', [
    (dict(SLURM_NNODES='2', SLURM_NTASKS='4'), 2),
    (dict(SLURM_NNODES='3', SLURM_STEP_NUM_NODES='1'), 1),  # a one-node step of a larger job
    (dict(WORLD_SIZE='8', LOCAL_WORLD_SIZE='4'), 2),
    (dict(WORLD_SIZE='4', LOCAL_WORLD_SIZE='4'), 1),
    (dict(WORLD_SIZE='4'), None),  # no launcher count: unknown
])
def test_node_count_follows_the_launcher_not_name_resolution(variables, nodes):
    for master in ('127.0.0.1', 'localhost', '10.9.8.7'):  # where MASTER_ADDR resolves makes no difference
        env = dict(variables, MASTER_ADDR=master)
        assert netif.node_count(env) == nodes
        assert netif.multi_node(env) == (nodes is not None and nodes > 1)


def test_torchrun_options_stop_at_the_script():
    argv = ['--nnodes=2', '--rdzv-conf=join_timeout=9,is_host=1', '--rdzv-backend', 'c10d', 'train.py',
            '--nnodes=7']
    assert torchrun_tool.option(argv, '--nnodes') == '2'
    assert torchrun_tool.option(argv, '--rdzv-backend', '--rdzv_backend') == 'c10d'
    assert torchrun_tool.rdzv_conf(argv) == {'join_timeout': '9', 'is_host': '1'}
    assert torchrun_tool.option(['train.py', '--nnodes=3'], '--nnodes') is None
    # a static launch on loopback gets nothing added
    static = ['--nnodes=2', '--master_addr=127.0.0.1', '--master_port=29500', 'train.py']
    assert torchrun_tool.with_local_addr(static) == static
    assert torchrun_tool.endpoint(static) == '127.0.0.1:29500'


def test_an_unreachable_endpoint_is_raised_and_main_makes_it_one_line(monkeypatch, capsys):
    """with_local_addr raises (a caller gets an exception, never an exit); the wrapper's main prints
    its one line and returns 1, as tools/torchrun.py exits."""
    def no_route(host):
        raise OSError('no route')
    monkeypatch.setattr(netif, 'route_to', no_route)
    argv = ['--rdzv-backend=c10d', '--rdzv-endpoint=10.9.8.7:29400', 'train.py']
    message = "the rendezvous endpoint 10.9.8.7 cannot be reached from this node (no route): set MASTER_ADDR " \
              "to node 0's address"
    with pytest.raises(torchrun_tool.EndpointUnreachable) as raised:
        torchrun_tool.with_local_addr(argv)
    assert str(raised.value) == message
    assert torchrun_tool.main(argv) == 1
    assert capsys.readouterr().err == f'error: {message}\n'


def test_rendezvous_failure_names_endpoint_nodes_and_timeout():
    argv = ['--nnodes=2', '--node_rank=0', '--master_addr=10.1.2.3', '--master_port=29511',
            '--rdzv-conf=timeout=8', 'train.py']
    exc = dist.DistStoreError('Timed out after 9 seconds waiting for clients. 1/2 clients joined.')
    assert torchrun_tool.rendezvous_failure(exc, argv).startswith(
        'error: the static rendezvous at 10.1.2.3:29511 did not complete: 2 node(s) expected, waited '
        'RDZV_TIMEOUT=8 s (DistStoreError: Timed out after 9 seconds waiting for clients. 1/2 clients joined.)')
    assert torchrun_tool.rendezvous_failure(RuntimeError('worker failed'), argv) is None


def test_slurm_job_port_comes_from_the_job_id():
    assert job_port('1234') == 21234 and job_port('98765') == 28765
    assert len({job_port(str(j)) for j in range(100, 200)}) == 100


def test_other_nodes_come_from_the_slurm_node_list_or_the_torchrun_store(monkeypatch):
    """Where node 0's own name is loopback, it needs another node: under Slurm the other hosts of
    the node list, under torchrun the address node 1 published in the rendezvous store."""
    from xcit_dense.engine.distributed import process_group as engine_dist
    from xcit_dense.engine.distributed.run_context import current_context
    monkeypatch.setattr(current_context(), 'slurm_hosts', ['node1', 'node2', 'node3'])
    monkeypatch.setenv('MASTER_ADDR', 'node1')
    monkeypatch.setenv('SLURMD_NODENAME', 'node1')
    assert engine_dist._other_nodes('slurm', None) == ['node1', 'node2', 'node3']
    monkeypatch.setenv('SLURMD_NODENAME', 'node2')
    assert engine_dist._other_nodes('slurm', None) == ['node1', 'node3']

    store = dist.HashStore()
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setenv('GROUP_RANK', '1')  # node 1 publishes its address on the route to the master
    monkeypatch.setenv('MASTER_ADDR', 'node0.example')  # node 1 on another machine than node 0
    route = netif.Route(master='10.1.2.1', address='10.1.2.3', interface='eth0')
    monkeypatch.setattr(netif, 'route_to', lambda host: route)
    monkeypatch.setattr(netif, 'is_loopback', lambda host: host in ('127.0.0.1', 'localhost'))
    assert engine_dist._other_nodes('pytorch', store) == ['node0.example']
    assert store.get('xcit_dense/node1/address') == b'10.1.2.3'
    monkeypatch.undo()
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.setenv('GROUP_RANK', '1')  # node 1 on node 0's machine: loopback is their network
    assert engine_dist._other_nodes('pytorch', store) is None
    assert store.get('xcit_dense/node1/address') == b'127.0.0.1'
    monkeypatch.setenv('GROUP_RANK', '0')  # and node 0 learns it from node 1's loopback address
    assert engine_dist._other_nodes('pytorch', store) is None
    store.set('xcit_dense/node1/address', '10.1.2.3')
    monkeypatch.setenv('GROUP_RANK', '0')  # node 0, its master name loopback here, takes node 1's
    assert engine_dist._other_nodes('pytorch', store) == ['127.0.0.1', '10.1.2.3']
    monkeypatch.setenv('MASTER_ADDR', '10.9.8.7')  # a master address that is not loopback is enough
    assert engine_dist._other_nodes('pytorch', dist.HashStore()) == ['10.9.8.7']
