"""The network rate from /proc/net/dev and the GPU figures from NVML, read by the sampler thread's
work (``sample``) at given times: stand-ins for the kernel's table and for NVML (its interface:
handles by UUID, utilisation, memory, MIG)."""
from types import SimpleNamespace

import pytest

from xcit_dense.engine.telemetry.node_sampler import NodeSampler, gpu_by_uuid, group_interface, read_net_dev
from xcit_dense.engine.telemetry.rank_stats import RankFigures, RanksSummary

pytestmark = pytest.mark.quick

HEADER = ('Inter-|   Receive                                                |  Transmit\n'
          ' face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls '
          'carrier compressed\n')


def net_dev(path, eth0: tuple, lo: tuple = (5, 5)) -> None:
    """A /proc/net/dev table with lo and eth0 at (received, sent) bytes."""
    rows = [f'{name:>6}: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0' for name, (rx, tx) in (('lo', lo), ('eth0', eth0))]
    path.write_text(HEADER + '\n'.join(rows) + '\n')


def test_the_network_rate_is_the_counters_change_over_the_time_between_readings(tmp_path):
    table = tmp_path / 'net_dev'
    net_dev(table, (1_000_000, 2_000_000))
    assert read_net_dev('eth0', str(table)) == (1_000_000, 2_000_000) and read_net_dev('ib0', str(table)) is None
    sampler = NodeSampler('eth0', None, net_dev=str(table))
    sampler.sample(now=100.0)
    net_dev(table, (1_000_000 + 3 * 2 ** 20, 2_000_000 + 2 ** 20), lo=(9 * 2 ** 30, 9 * 2 ** 30))
    sampler.sample(now=102.0)
    use = sampler.take()
    assert (use.interface, use.received_mb_s, use.sent_mb_s) == ('eth0', 1.5, 0.5)
    net_dev(table, (1_000_000 + 7 * 2 ** 20, 2_000_000 + 2 ** 20))
    sampler.sample(now=106.0)  # the next interval starts at the last reading of the previous one
    assert (sampler.take().received_mb_s, sampler.take().received_mb_s) == (1.0, None)


def test_the_interface_is_the_process_groups():
    assert group_interface('nccl', dict(NCCL_SOCKET_IFNAME='=ib0,eth0', GLOO_SOCKET_IFNAME='eth1')) == 'ib0'
    assert group_interface('gloo', dict(NCCL_SOCKET_IFNAME='ib0', GLOO_SOCKET_IFNAME='eth1')) == 'eth1'
    assert group_interface('gloo', dict(MASTER_ADDR='127.0.0.1')) == 'lo'  # the route to the master
    assert group_interface('gloo', {}) is None


class FakeNVML:
    """NVML's functions over two devices: a whole GPU and a MIG slice (no utilisation there)."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.devices = {'GPU-1111': dict(mig=False, util=55, used=3 * 2 ** 30, total=80 * 2 ** 30),
                        'MIG-2222': dict(mig=True, util=None, used=2 ** 30, total=10 * 2 ** 30)}

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.devices:
            raise self.NVMLError('Not Found')
        return uuid

    def nvmlDeviceIsMigDeviceHandle(self, handle):
        return int(self.devices[handle]['mig'])

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.devices[handle]['util'] is None:
            raise self.NVMLError('Not Supported')
        return SimpleNamespace(gpu=self.devices[handle]['util'], memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle):
        device = self.devices[handle]
        return SimpleNamespace(used=device['used'], total=device['total'], free=device['total'] - device['used'])


def figures(rank: int, node) -> RankFigures:
    return RankFigures(rank=rank, host='node0', memory_mb=100.0, reserved_mb=10.0, data_wait=0.0,
                       own_step_s=None, interval_s=1.0, node=node)


def test_a_gpu_is_found_by_the_uuid_torch_reports_and_a_mig_slice_has_memory_only():
    nvml = FakeNVML()
    gpu, mig = gpu_by_uuid(nvml, '1111'), gpu_by_uuid(nvml, '2222')  # (torch's UUIDs carry no prefix)
    with pytest.raises(FakeNVML.NVMLError):
        gpu_by_uuid(nvml, '3333')
    assert (gpu.mig, mig.mig) == (False, True)
    assert gpu.read() == (55.0, 3 * 1024, 80 * 1024) and mig.read() == (None, 1024, 10 * 1024)
    whole, sliced = NodeSampler(None, gpu), NodeSampler(None, mig)
    for sampler in (whole, sliced):
        sampler.sample(now=1.0)
        sampler.sample(now=2.0)
    line = RanksSummary([figures(0, whole.take())]).line()
    assert 'GPU utilisation min 55% (rank 0, node0), GPU memory max 3072 of 81920 MB' in line
    summary = RanksSummary([figures(0, sliced.take())])
    assert 'GPU utilisation n/a (MIG), GPU memory max 1024 of 10240 MB' in summary.line()
    assert 'gpu_idle' not in summary.warnings(2)
    nvml.devices['GPU-1111']['util'] = 20
    whole.sample(now=3.0)
    assert 'under 70%' in RanksSummary([figures(0, whole.take())]).warnings(2)['gpu_idle']


def test_a_rank_waiting_in_communication_is_warned_of_with_its_nodes_network(tmp_path):
    table = tmp_path / 'net_dev'
    net_dev(table, (0, 0))
    sampler = NodeSampler('eth0', None, net_dev=str(table))
    sampler.sample(now=0.0)
    net_dev(table, (10 * 2 ** 20, 20 * 2 ** 20))
    sampler.sample(now=10.0)
    use = sampler.take()
    ranks = [RankFigures(rank=r, host=f'node{r}', memory_mb=1.0, reserved_mb=None, data_wait=0.0, own_step_s=0.1,
                         interval_s=1.0, comm_wait=wait, node=use if r == 1 else None)
             for r, wait in enumerate((0.1, 0.45))]
    summary = RanksSummary(ranks)
    assert 'communication wait max 45.0% (rank 1, node1)' in summary.line()
    assert 'network node1 eth0 1.0 MB/s in, 2.0 MB/s out' in summary.line()
    assert summary.scalars()['ranks/net_sent_mb_s/node1'] == 2.0
    warning = summary.warnings(2)['comm_wait']
    assert warning.startswith('rank 1, node1 waited in gradient communication 45%')
    assert 'the limit; eth0 of node1 carried 1.0 MB/s in and 2.0 MB/s out' in warning
    ranks[1].comm_wait = 0.25
    assert 'comm_wait' not in RanksSummary(ranks).warnings(2)
