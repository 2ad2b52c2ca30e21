"""The pieces of the scale-out launch that need no processes: the route to the master, the
torchrun wrapper's options and rendezvous report, the Slurm job's port."""
import socket

import pytest
import torch.distributed as dist

from xcit_dense.engine.dist import job_port
from xcit_launch import netif
from xcit_launch import torchrun as torchrun_tool


def test_route_to_loopback_is_lo():
    assert netif.route_to('127.0.0.1') == netif.Route('127.0.0.1', '127.0.0.1', 'lo')
    assert netif.is_loopback('localhost') and netif.is_loopback('127.0.0.1')


def local_addresses():
    return [(name, netif._ipv4_of(name)) for _, name in socket.if_nameindex()
            if netif._ipv4_of(name) and not netif._ipv4_of(name).startswith('127.')]


def test_route_to_an_own_address_names_its_interface():
    found = local_addresses()
    if not found:
        pytest.skip('this machine has no non-loopback IPv4 address')
    name, address = found[0]
    assert netif.route_to(address) == netif.Route(address, address, name)
    env = {'MASTER_ADDR': address}
    assert netif.gloo_interface(env) == netif.Route(address, address, name)
    assert netif.gloo_interface(dict(env, GLOO_SOCKET_IFNAME='other0')) is None  # an explicit choice wins
    assert netif.gloo_interface({'MASTER_ADDR': '127.0.0.1'}) is None  # one node: gloo's default


def test_unresolvable_master_raises():
    with pytest.raises(OSError):
        netif.gloo_interface({'MASTER_ADDR': 'no-such-host.invalid'})


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
