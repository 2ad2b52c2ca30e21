"""Images per second over all ranks, for comparing runs on different hardware."""
import time
from typing import Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..distributed.process_group import world_size


@HOOKS.register_module()
class ThroughputHook(Hook):
    """Log images per second summed over all ranks (``img_per_s``), data loading included."""

    priority = 'NORMAL'

    def before_train(self, runner) -> None:
        """Start the clock at the first iteration so that set-up time is not counted."""
        self._last = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch: Optional[dict] = None,
                         outputs=None) -> None:
        """Record this iteration's rate in the message hub, where the logger picks it up."""
        now = time.perf_counter()
        images = len(data_batch['inputs']) * world_size() if data_batch else 0
        runner.message_hub.update_scalar('train/img_per_s', images / max(now - self._last, 1e-9))
        self._last = now
