"""``AutoFitHook``: the auto-fit result (engine/planning/auto_fit.py) in every checkpoint's meta, under a key of
its own, apart from the batch plan that ``BatchPlanHook`` compares on resume."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

AUTO_FIT_KEY = 'auto_fit'


@HOOKS.register_module()
class AutoFitHook(Hook):
    """Writes ``record`` (requested and fitted plan, world size, device name and total memory) into
    ``checkpoint['meta']['auto_fit']``; added by the run's assembly when ``--auto-fit`` is on."""

    priority = 'VERY_LOW'

    def __init__(self, record: dict) -> None:
        self.record = dict(record)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})[AUTO_FIT_KEY] = dict(self.record)
