"""Which ranks compiled inside the current training step: told through the process group's store.

``torch.compile`` compiles at a graph's first call and again for each new input size (multi-scale
training; sizes are not marked dynamic, see ``engine.training.compile``), so a step after the first may
compile on one rank while its peers already wait for it in a collective (SyncBN's, the gradient
all-reduce). Under the ordinary step bound they would end a healthy run. So a compile on any rank
extends the step's bound on every rank, by ``XCIT_COMPILE_TIMEOUT`` (``engine.distributed.wait_bounds``):

- each rank counts its bounded steps (``step_began``/``step_ended``, every rank alike), and dynamo's
  compile-start callback (registered by ``enable``, which the run's ``compile_forward`` calls)
  writes in the store the step in which this rank compiles: no collective inside the step;
- a rank whose step bound runs out asks the store which ranks compiled in this step
  (``extension_s``, the step watch's extension in ``dist``) and then waits the compile bound
  longer, saying so in its log.

A collective keeps the timeout it was issued with (gloo's and NCCL's alike, and a waiting rank
issued it before it could know), so in a run that compiles the process groups' timeout inside a
step already includes the compile bound; the step watch alone holds the ordinary bound.
"""
import sys
from typing import List

import torch.distributed as dist

from .wait_bounds import COMPILE_VARIABLE

_KEY = 'xcit_dense/compiled'  # + rank: the last bounded step in which that rank began a compile
_ENABLED = False
_STEP = 0  # bounded steps begun by this process: every rank begins as many
_IN_STEP = False


def enable() -> None:
    """Tell the peers of this process's compiles inside bounded steps from now on (once per process)."""
    global _ENABLED
    if not _ENABLED:
        from torch._dynamo.callback import callback_handler  # dynamo only where the run compiles
        callback_handler.register_start_callback(_announce)
        _ENABLED = True


def enabled() -> bool:
    """Whether this process compiles (``enable`` was called): its steps' bounds may be extended."""
    return _ENABLED


def step_began() -> None:
    global _STEP, _IN_STEP
    _STEP += 1
    _IN_STEP = True


def step_ended() -> None:
    global _IN_STEP
    _IN_STEP = False


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


def _announce(*_args) -> None:
    """dynamo's compile-start callback (its argument differs between torch versions): the step in
    which this rank compiles, in the store, when it compiles inside a bounded step."""
    if not (_IN_STEP and dist.is_initialized()):
        return
    try:
        _store().set(f'{_KEY}{dist.get_rank()}', str(_STEP))
    except Exception as exc:  # raised here it would fail the compile and turn the run eager
        print(f'warning: rank {dist.get_rank()} could not tell its peers that it compiles ({exc!r}): they may '
              f'end the run at the step bound', file=sys.stderr, flush=True)


def ranks_compiled_in_step() -> List[int]:
    """The ranks that began a compile in this process's current bounded step (this one included)."""
    if not dist.is_initialized():
        return []
    store, step = _store(), str(_STEP).encode()
    keys = [f'{_KEY}{rank}' for rank in range(dist.get_world_size())]
    return [rank for rank, key in enumerate(keys) if store.check([key]) and store.get(key) == step]


def extension_s(compile_s: int) -> int:
    """``compile_s`` where a rank compiled in the current bounded step, said in the log; 0 otherwise
    (also where the store cannot be asked: the lost-peer report that follows says so)."""
    if not _ENABLED:
        return 0
    try:
        ranks = ranks_compiled_in_step()
    except Exception:  # the store's host is gone
        return 0
    if not ranks:
        return 0
    print(f"rank {dist.get_rank()}: rank(s) {', '.join(map(str, ranks))} compiled in this step (a first compile, "
          f'or a recompile for a new input size): its bound is extended by {COMPILE_VARIABLE}={compile_s} s',
          file=sys.stderr, flush=True)
    return compile_s
