"""Which ranks compiled inside the current training step: told through the process group's store.

``torch.compile`` compiles at a graph's first call and again for each new input size (multi-scale
training; sizes are not marked dynamic, see ``engine.training.compile``), so a step after the first may
compile on one rank while its peers already wait for it in a collective (SyncBN's, the gradient
all-reduce). Under the ordinary step bound they would end a healthy run. So a compile on any rank
extends the step's bound on every rank, by ``XCIT_COMPILE_TIMEOUT`` (``engine.distributed.wait_bounds``):

- each rank counts its bounded steps (``CompileBound.step_began``/``step_ended``, every rank alike), and
  dynamo's compile-start callback (registered by ``enable``, which the run's ``compile_forward`` calls)
  writes in the store the step in which this rank compiles: no collective inside the step;
- a rank whose step bound runs out asks the store which ranks compiled in this step
  (``extension_s``, the step watch's extension in ``dist``) and then waits the compile bound
  longer, saying so in its log.

A collective keeps the timeout it was issued with (gloo's and NCCL's alike, and a waiting rank
issued it before it could know), so in a run that compiles the process groups' timeout inside a
step already includes the compile bound; the step watch alone holds the ordinary bound.
"""
import sys
from typing import Callable, List, Optional

import torch.distributed as dist

from .wait_bounds import COMPILE_VARIABLE

_KEY = 'xcit_dense/compiled'  # + rank: the last bounded step in which that rank began a compile


class CompileBound:
    """One run's compile bookkeeping: whether it compiles, its bounded steps, and the dynamo callback
    it registered (removed by ``close``, which the run's context calls as the run ends)."""

    def __init__(self) -> None:
        self._callback: Optional[Callable[..., None]] = None  # registered with dynamo by ``enable``
        self._step = 0  # bounded steps begun by this run: every rank begins as many
        self._in_step = False

    def enable(self) -> None:
        """Tell the peers of this process's compiles inside bounded steps from now on (once per run)."""
        if self._callback is None:
            from torch._dynamo.callback import callback_handler  # dynamo only where the run compiles
            self._callback = callback_handler.register_start_callback(self._announce)

    def enabled(self) -> bool:
        """Whether this run compiles (``enable`` was called): its steps' bounds may be extended."""
        return self._callback is not None

    def close(self) -> None:
        """Remove the dynamo callback (a later run in this process registers its own)."""
        if self._callback is not None:
            from torch._dynamo.callback import callback_handler
            callback_handler.remove_start_callback(self._callback)
            self._callback = None

    def step_began(self) -> None:
        self._step += 1
        self._in_step = True

    def step_ended(self) -> None:
        self._in_step = False

    def _announce(self, *_args) -> None:
        """dynamo's compile-start callback (its argument differs between torch versions): the step in
        which this rank compiles, in the store, when it compiles inside a bounded step."""
        if not (self._in_step and dist.is_initialized()):
            return
        try:
            _store().set(f'{_KEY}{dist.get_rank()}', str(self._step))
        except Exception as exc:  # raised here it would fail the compile and turn the run eager
            print(f'warning: rank {dist.get_rank()} could not tell its peers that it compiles ({exc!r}): they may '
                  f'end the run at the step bound', file=sys.stderr, flush=True)

    def ranks_compiled_in_step(self) -> List[int]:
        """The ranks that began a compile in this run's current bounded step (this one included)."""
        if not dist.is_initialized():
            return []
        store, step = _store(), str(self._step).encode()
        keys = [f'{_KEY}{rank}' for rank in range(dist.get_world_size())]
        return [rank for rank, key in enumerate(keys) if store.check([key]) and store.get(key) == step]

    def extension_s(self, compile_s: int) -> int:
        """``compile_s`` where a rank compiled in the current bounded step, said in the log; 0 otherwise
        (also where the store cannot be asked: the lost-peer report that follows says so)."""
        if not self.enabled():
            return 0
        try:
            ranks = self.ranks_compiled_in_step()
        except Exception:  # the store's host is gone
            return 0
        if not ranks:
            return 0
        print(f"rank {dist.get_rank()}: rank(s) {', '.join(map(str, ranks))} compiled in this step (a first compile, "
              f'or a recompile for a new input size): its bound is extended by {COMPILE_VARIABLE}={compile_s} s',
              file=sys.stderr, flush=True)
        return compile_s


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()
