"""The log's environment header states the process group and devices in use, not the config's
NCCL and MMEngine's "GPU number"."""
import torch.distributed as dist
from helpers import ToyModel

from xcit_dense.engine.training.runner import ToolkitRunner


def test_a_gloo_group_on_cpus_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv('LOCAL_RANK', '0')  # as torchrun sets it
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0, world_size=1)
    try:
        runner = ToolkitRunner(model=ToyModel(), work_dir=str(tmp_path / 'work'), launcher='pytorch',
                               env_cfg=dict(dist_cfg=dict(backend='nccl')),
                               cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel',
                                                               device_ids=None)),
                               experiment_name='env_header')
        log = open(runner.logger.log_file).read()
    finally:
        dist.destroy_process_group()
    assert "dist_cfg: {'backend': 'gloo'}" in log
    assert 'process group: gloo, 1 processes' in log and 'devices: 1 CPU process(es)' in log
    assert 'GPU number' not in log and 'nccl' not in log
