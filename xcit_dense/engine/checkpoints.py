"""Former home of the training-checkpoint helpers, kept as an import path; see xcit_dense.checkpoint."""
from ..checkpoint import (AtomicLocalBackend, allow_mmengine_checkpoints, check_matches_model,
                          find_resumable_checkpoint, write_pointer)

__all__ = ['AtomicLocalBackend', 'allow_mmengine_checkpoints', 'check_matches_model',
           'find_resumable_checkpoint', 'write_pointer']
