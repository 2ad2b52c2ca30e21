"""Progress bars for evaluation: MMEngine only logs every ``logger.interval`` batches."""
import sys
from typing import Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from tqdm import tqdm


@HOOKS.register_module()
class EvalProgressHook(Hook):
    """A progress bar over the batches of each validation and test run (rank 0, on stderr)."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self._bar: Optional[tqdm] = None

    def _open(self, runner, loop, desc: str) -> None:
        """One bar per evaluation run, on rank 0 only so that ranks do not interleave bars."""
        if runner.rank == 0:
            self._bar = tqdm(total=len(loop.dataloader), desc=desc, unit='batch', file=sys.stderr)

    def _advance(self) -> None:
        """One batch done."""
        if self._bar is not None:
            self._bar.update(1)

    def _close(self) -> None:
        """End the bar so that the log lines after it start on a clean line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def before_val_epoch(self, runner) -> None:
        self._open(runner, runner.val_loop, 'validation')

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._advance()

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._close()

    def before_test_epoch(self, runner) -> None:
        self._open(runner, runner.test_loop, 'test')

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._advance()

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._close()
