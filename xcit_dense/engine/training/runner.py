"""MMEngine's Runner with the toolkit's training loops, an environment header that states the process
group and devices in use, a resume from a checkpoint already read, and a log folder and config dump
that no link planted in a shared work dir can redirect (io/output_files.py).

MMEngine's header prints the config's ``dist_cfg`` (NCCL in the recipes) and the world size as
"GPU number", also for gloo on CPU processes; the toolkit's runtime lines take their place (a filter
on the Runner's logger). The runtime configs name this runner (``runner_type``), so mmdet's and
mmseg's own tools use it too.
"""
import inspect
import logging
import os
from collections import OrderedDict
from contextlib import nullcontext
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.dist import master_only
from mmengine.logging import MMLogger
from mmengine.registry import LOOPS, RUNNERS
from mmengine.runner import BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop, Runner

from xcit_launch.known_warnings import KnownLogMessages, without_known_prints

from ...allocation_failures import is_out_of_memory
from ...compile_option import take_compile_option
from ...io.checked_unpickler import MAX_REASON
from ...io.checkpoint import CheckpointError
from ...io.checkpoint_schemes import handed_over
from ...io.output_files import check_log_folder, refuse_link, writing
from ..distributed.process_group import gpus_present
from .compile import compile_forward
from .config_text import FormattedOnceConfig
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


DASH = '-' * 60
HEADER_START = f'\n{DASH}\nSystem environment:'  # MMEngine's environment header
RUNTIME = '\nRuntime environment:'


class RuntimeLines(logging.Filter):
    """Put ``lines`` in the place of the runtime part of MMEngine's environment header (its system part
    kept)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__()
        self.lines = list(lines)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if isinstance(message, str) and message.startswith(HEADER_START) and RUNTIME in message:
            system = message.split(RUNTIME, 1)[0]
            record.msg = '\n'.join([system + RUNTIME, *self.lines, DASH]) + '\n'
        return True


@RUNNERS.register_module()
class ToolkitRunner(Runner):
    """A Runner whose training loops are the toolkit's, whose log states the backend and devices in
    use and skips known deprecation notices, that resumes from a checkpoint already read (a failure of
    the restore: CheckpointError naming the file), and that
    writes its log and config dump through no link (UnsafeOutputError instead); its config formats its text
    once per content (config_text.py), not at each of MMEngine's requests."""

    def __init__(self, *args, **kwargs) -> None:
        arguments = inspect.signature(Runner.__init__).bind(self, *args, **kwargs)
        arguments.apply_defaults()
        self.env_cfg = dict(arguments.arguments['env_cfg'] or {})
        self.randomness = dict(arguments.arguments['randomness'] or {})  # (what the loops build their data with)
        self._handed: Optional[Tuple[str, dict]] = None
        if isinstance(arguments.arguments['cfg'], Config):  # (a dict stays MMEngine's: a Runner built by hand)
            arguments.arguments['cfg'] = FormattedOnceConfig.of(arguments.arguments['cfg'])
        super().__init__(*arguments.args[1:], **arguments.kwargs)

    def runtime_environment(self) -> 'OrderedDict[str, object]':
        """The header's runtime part: the process group and devices in use."""
        runtime = OrderedDict((k, v) for k, v in self.env_cfg.items() if k != 'dist_cfg')
        runtime.update(self.randomness)
        runtime['seed'] = self.seed
        runtime['launcher'] = self.launcher
        if dist.is_initialized():
            runtime['dist_cfg'] = dict(self.env_cfg.get('dist_cfg') or {}, backend=dist.get_backend())
            runtime['process group'] = f'{dist.get_backend()}, {self.world_size} processes'
        else:
            runtime['process group'] = 'none (one process)'
        runtime['devices'] = describe_devices(self.world_size)
        return runtime

    def build_logger(self, *args, **kwargs) -> MMLogger:
        """MMEngine's logger, without the known deprecation notices and with the toolkit's runtime lines
        in its environment header; the log folder checked first (``check_log_folder``: not a link, yours,
        no link in it), as MMEngine opens the log by name, and a link at the config dump's name refused
        now, before the model is built (``dump_config`` writes through no link whatever is there then)."""
        check_log_folder(self.log_dir)
        refuse_link(self._config_dump())
        logger = super().build_logger(*args, **kwargs)
        logger.addFilter(KnownLogMessages())
        logger.addFilter(RuntimeLines([f'    {k}: {v}' for k, v in self.runtime_environment().items()]))
        return logger

    @master_only
    def dump_config(self) -> None:
        """MMEngine's config dump (``<work_dir>/<config's file name>``, else ``<timestamp>.py``), written
        through no link: a link at that name is refused (UnsafeOutputError), never written through."""
        with writing(self._config_dump()) as path:
            self.cfg.dump(path)

    def _config_dump(self) -> str:
        """Where MMEngine's ``dump_config`` writes the config."""
        name = os.path.basename(self.cfg.filename) if self.cfg.filename is not None else f'{self.timestamp}.py'
        return os.path.join(self.work_dir, name)

    def build_model(self, model):
        """MMEngine's ``build_model``, with the backbone compiled where its config says
        ``compile=True`` (engine/training/compile.py: the fallback to eager lives there, not in the model)."""
        model, compile_backbone = take_compile_option(model)
        built = super().build_model(model)
        if compile_backbone:
            compile_forward(built.backbone)
        return built

    def build_train_loop(self, loop: Union[BaseLoop, dict]) -> BaseLoop:
        """MMEngine's ``build_train_loop``, its epoch and iteration loops built as the toolkit's
        (engine/training/loops.py: a resume continues at the data position)."""
        return super().build_train_loop(as_toolkit_loop(loop) if isinstance(loop, dict) else loop)

    def hand_checkpoint(self, filename: str, checkpoint: dict) -> None:
        """Give the Runner the contents of ``filename``, already read (engine/training/resume.py, fine_tune.py
        and tools/test.py read a checkpoint once): its load of that file uses them instead of reading it
        again (``checkpoint_schemes.handed_over``).

        The contents are on the CPU where MMEngine's GPU resume maps them to the rank's device; what
        it does with them still lands there (GPU-only path, not run by the CPU tests): the weights
        are copied into the parameters and torch's optimizer casts its state to each parameter's
        device (the RNG states are NumPy arrays, which no map location moves)."""
        self._handed = (filename, checkpoint)

    def resume(self, filename: str, *args, **kwargs) -> None:
        """MMEngine's ``resume``, where an error while it restores the checkpoint (which engine/training/resume.py
        judged whole before: io/checkpoint_schema.py) ends as one CheckpointError naming the file, which
        tools/train.py prints in one line; an allocation failure is left to the out-of-memory advice."""
        try:
            super().resume(filename, *args, **kwargs)
        except Exception as exc:
            if is_out_of_memory(exc) or isinstance(exc, CheckpointError) and filename in str(exc):
                raise
            text = str(exc).strip()
            reason = text.splitlines()[0][:MAX_REASON] if text else type(exc).__name__
            raise CheckpointError(f'cannot resume from {filename}: {reason}') from exc

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: Sequence[Tuple[str, str]] = ((r'^module.', ''),)):
        """MMEngine's ``load_checkpoint``, on the handed contents when they are this file's (served by the
        toolkit's checked readers, ``checkpoint_schemes.handed_over``, where they are installed; dropped
        once the load is done), without the bare notice its reader prints (``without_known_prints``: the
        log names the file)."""
        handed, self._handed = self._handed, None
        with without_known_prints(), handed_over(*handed) if handed else nullcontext():
            return super().load_checkpoint(filename, map_location, strict, revise_keys)
