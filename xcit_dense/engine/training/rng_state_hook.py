"""Every rank's random-number generator states in checkpoints, so that a resumed run draws the
same drop paths (and, with samplers other than the toolkit's, which seed each sample, the same
augmentations) as an uninterrupted one (MMEngine only re-seeds on resume)."""
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...io.checkpoint_schema import rng_states_of
from ..distributed.checkpoint_schedule import checkpoint_due
from ..distributed.collectives import gather_objects
from ..distributed.process_group import world_size


def _as_bytes(state: torch.Tensor) -> np.ndarray:
    """A torch generator state as a NumPy byte array: a checkpoint's ``map_location`` moves tensors
    to the run's device (MMEngine's resume maps them to the GPU), never NumPy arrays."""
    return state.cpu().numpy().copy()


def _as_byte_tensor(state) -> torch.Tensor:
    """The CPU ByteTensor torch's ``set_rng_state`` takes, from a NumPy byte array or a tensor on
    any device (checkpoints written before the states were stored as arrays)."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    return torch.from_numpy(np.ascontiguousarray(state, dtype=np.uint8))


def get_rng_state() -> dict:
    """This process's Python, NumPy, torch CPU and (once initialised) CUDA generator states; CUDA's
    of the device set for this rank, the only one it draws on. Torch's as NumPy byte arrays."""
    state = dict(python=random.getstate(), numpy=np.random.get_state(),
                 torch=_as_bytes(torch.get_rng_state()))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = _as_bytes(torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict) -> Optional[str]:
    """Put back the states of ``get_rng_state``; returns what could not be restored (None: all).

    A CUDA state goes to this rank's current device. A list of per-device states (checkpoints
    written before the per-device rule) is restored only onto as many visible GPUs."""
    random.setstate(state['python'])
    np.random.set_state(state['numpy'])
    torch.set_rng_state(_as_byte_tensor(state['torch']))
    cuda = state.get('cuda')
    if cuda is None:
        return None
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if isinstance(cuda, (list, tuple)):
        if len(cuda) != visible:
            return f'the CUDA states of {len(cuda)} GPU(s), but this process sees {visible}'
        torch.cuda.set_rng_state_all([_as_byte_tensor(device) for device in cuda])
    elif not visible:
        return 'the CUDA state, since this process sees no GPU'
    else:
        torch.cuda.set_rng_state(_as_byte_tensor(cuda))
    return None


def _log_restored(logger, missed: Optional[str]) -> None:
    """Say what was restored, and what not."""
    if missed:
        logger.warning(f'RNG states restored from the checkpoint, except {missed}: those '
                       f'random numbers continue from the seed')
    else:
        logger.info('RNG states restored from the checkpoint')


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Save each rank's RNG states in ``checkpoint['meta']['rng_states']``; restore on resume.

    The states saved are those at the end of the last training iteration. A checkpoint is
    written by rank 0 alone, so all ranks' states are gathered (a few kilobytes each) at the
    iterations that write a checkpoint: those of the checkpoint hook's schedule (``checkpoint_due``),
    and a preemption stop (``before_preemption_checkpoint``). Validation leaves the states as it found them, since a
    resumed run does not repeat it.
    """

    priority = 'LOW'  # after_train_iter before the checkpoint hooks (VERY_LOW)

    def __init__(self) -> None:
        self._latest: Optional[List[dict]] = None  # every rank's states, gathered for the checkpoint now due
        self._own: Optional[dict] = None
        self._loaded: Optional[List[dict]] = None
        self._before_val: Optional[dict] = None

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """Forget the states gathered after the last iteration: from now on they are not the run's."""
        self._latest = None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Note this rank's states; gather every rank's when a checkpoint is written now."""
        self._own = get_rng_state()
        if checkpoint_due(runner, batch_idx):
            self._gather(runner)

    def _gather(self, runner) -> None:
        """Every rank's states after this iteration, ready for the checkpoint (a collective: all
        ranks call it at the same iteration)."""
        self._latest = gather_objects(self._own if self._own is not None else get_rng_state())

    def before_preemption_checkpoint(self, runner) -> None:
        """Every rank's states, for the preemption hook's checkpoint (which all ranks write at the
        same iteration)."""
        self._gather(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Store the states of all ranks, indexed by rank; in a distributed run only when they were
        gathered after the iteration that ended last: by an iteration schedule's checkpoint in that
        iteration's hooks, by an epoch schedule's once the loop has counted it (``runner.iter`` one
        more), and by a best checkpoint after the validation that follows (which leaves the states
        as it found them)."""
        if self._latest is not None:
            states = self._latest
        elif world_size() == 1:
            states = [self._own if self._own is not None else get_rng_state()]
        else:
            return
        checkpoint.setdefault('meta', {})['rng_states'] = states

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep the checkpoint's states (none in one written before this hook), typed, for training."""
        self._loaded = rng_states_of(checkpoint.get('meta', {}))

    def before_train(self, runner) -> None:
        """On resume, restore this rank's states once the data stands at its position (the toolkit's
        loops say when, ``when_at_position``): after the data loader's iterator drew its base seed from
        torch's generator, and, with samplers that cannot start there, after the dropped batches drew
        their augmentations.

        A checkpoint loaded for its weights alone (training from iteration 0) restores nothing.
        """
        states, self._loaded = self._loaded, None
        if states is None or runner.iter == 0:
            return
        if not states:
            runner.logger.info('RNG state was not in the checkpoint: random numbers continue '
                               'from the seed, not from where the run stopped')
            return
        if len(states) != world_size():
            runner.logger.info(f'RNG state not restored: the checkpoint holds {len(states)} '
                               f'rank(s), this run has {world_size()}')
            return
        state = states[runner.rank]

        def restore() -> None:
            _log_restored(runner.logger, set_rng_state(state))
        loop = runner.train_loop
        if hasattr(loop, 'when_at_position'):
            loop.when_at_position(restore)
        else:
            restore()

    def before_val(self, runner) -> None:
        """Note the training streams' states before validation."""
        self._before_val = get_rng_state()

    def after_val(self, runner) -> None:
        """Put the training streams back as validation found them."""
        if self._before_val is not None:
            set_rng_state(self._before_val)
            self._before_val = None
