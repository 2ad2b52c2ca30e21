"""MMEngine's Runner with an environment header that states the process group and devices in use.

MMEngine's header prints the config's ``dist_cfg`` (NCCL in the recipes) and the world size as
"GPU number", also for gloo on CPU processes. The runtime configs name this runner
(``runner_type``), so mmdet's and mmseg's own tools use it too.
"""
from collections import OrderedDict

import torch
import torch.distributed as dist
from mmengine.registry import RUNNERS
from mmengine.runner import Runner
from mmengine.utils.dl_utils import collect_env

from xcit_launch.known_warnings import KnownLogMessages
from .dist import gpus_present


def describe_devices(world_size: int) -> str:
    """'N GPU process(es) (name)' or 'N CPU process(es)': what the ranks really compute on."""
    if gpus_present():
        return f'{world_size} GPU process(es) ({torch.cuda.get_device_name()})'
    return f'{world_size} CPU process(es)'


@RUNNERS.register_module()
class ToolkitRunner(Runner):
    """A Runner whose log states the backend and devices in use and skips known deprecation notices."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.logger.addFilter(KnownLogMessages())

    def _log_env(self, env_cfg: dict) -> None:
        runtime = OrderedDict((k, v) for k, v in env_cfg.items() if k != 'dist_cfg')
        runtime.update(self._randomness_cfg)
        runtime['seed'] = self._seed
        runtime['launcher'] = self._launcher
        if dist.is_initialized():
            runtime['dist_cfg'] = dict(env_cfg.get('dist_cfg') or {}, backend=dist.get_backend())
            runtime['process group'] = f'{dist.get_backend()}, {self._world_size} processes'
        else:
            runtime['process group'] = 'none (one process)'
        runtime['devices'] = describe_devices(self._world_size)
        dash = '-' * 60
        lines = [dash, 'System environment:', *(f'    {k}: {v}' for k, v in collect_env().items()),
                 '', 'Runtime environment:', *(f'    {k}: {v}' for k, v in runtime.items()), dash]
        self.logger.info('\n' + '\n'.join(lines) + '\n')
        if self.cfg._cfg_dict:
            self.logger.info(f'Config:\n{self.cfg.pretty_text}')
