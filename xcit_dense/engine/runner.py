"""MMEngine's Runner with an environment header that states the process group and devices in use,
and that resumes from a checkpoint already read.

MMEngine's header prints the config's ``dist_cfg`` (NCCL in the recipes) and the world size as
"GPU number", also for gloo on CPU processes. The runtime configs name this runner
(``runner_type``), so mmdet's and mmseg's own tools use it too.
"""
from collections import OrderedDict
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from mmengine.model import is_model_wrapper
from mmengine.registry import LOOPS, RUNNERS
from mmengine.runner import BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from mmengine.runner.checkpoint import _load_checkpoint_to_model
from mmengine.utils.dl_utils import collect_env

from xcit_launch.known_warnings import KnownLogMessages

from .compile import compile_forward, take_compile_option
from .dist import gpus_present
from .loops import ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop

# MMEngine's training loops, and the toolkit's that resume at the data position in their place
TOOLKIT_LOOPS = {EpochBasedTrainLoop: ResumableEpochBasedTrainLoop, IterBasedTrainLoop: ResumableIterBasedTrainLoop}


def as_toolkit_loop(loop: dict) -> dict:
    """A training loop's config, MMEngine's loops (by ``type`` or ``by_epoch``) named as the toolkit's."""
    loop = dict(loop)
    if 'type' not in loop and 'by_epoch' in loop:
        loop['type'] = EpochBasedTrainLoop if loop.pop('by_epoch') else IterBasedTrainLoop
    kind = loop.get('type')
    kind = LOOPS.get(kind) if isinstance(kind, str) else kind
    if kind in TOOLKIT_LOOPS:
        loop['type'] = TOOLKIT_LOOPS[kind]
    return loop


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
        self._handed: Optional[Tuple[str, dict]] = None

    def build_model(self, model):
        """MMEngine's ``build_model``, with the backbone compiled where its config says
        ``compile=True`` (engine/compile.py: the fallback to eager lives there, not in the model)."""
        model, compile_backbone = take_compile_option(model)
        built = super().build_model(model)
        if compile_backbone:
            compile_forward(built.backbone)
        return built

    def build_train_loop(self, loop: Union[BaseLoop, dict]) -> BaseLoop:
        """MMEngine's ``build_train_loop``, its epoch and iteration loops built as the toolkit's
        (engine/loops.py: a resume continues at the data position)."""
        return super().build_train_loop(as_toolkit_loop(loop) if isinstance(loop, dict) else loop)

    def hand_checkpoint(self, filename: str, checkpoint: dict) -> None:
        """Give the Runner the contents of ``filename``, already read (engine/resume.py reads a
        resumed checkpoint once): its load of that file uses them instead of reading it again.

        The contents are on the CPU where MMEngine's GPU resume maps them to the rank's device; what
        it does with them still lands there (GPU-only path, not run by the CPU tests): the weights
        are copied into the parameters and torch's optimizer casts its state to each parameter's
        device (the RNG states are NumPy arrays, which no map location moves)."""
        self._handed = (filename, checkpoint)

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: Sequence[Tuple[str, str]] = ((r'^module.', ''),)):
        """MMEngine's ``load_checkpoint``, on the handed contents when they are this file's."""
        if self._handed is None or self._handed[0] != filename:
            return super().load_checkpoint(filename, map_location, strict, revise_keys)
        checkpoint, self._handed = self._handed[1], None
        # as MMEngine's: the hooks see the checkpoint, then the model gets its weights
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
        checkpoint = _load_checkpoint_to_model(model, checkpoint, strict, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint

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
