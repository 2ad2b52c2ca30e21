"""Whether this process's group is a restarted one: the agreement the ranks reach once the group has
formed (``dist.init_distributed``), read when the run chooses what to resume from (engine/training/resume.py)."""
import os
from typing import NamedTuple

from . import collectives


class Restart(NamedTuple):
    """How many times a group was started again after a failure (0 for a fresh run), and by what."""

    count: int
    by: str  # 'elastic restart' (torchrun --max-restarts), 'Slurm requeue' (sbatch --requeue) or ''


_restart = Restart(0, '')  # this process's group, agreed on when the group forms


def agree_on_restart() -> Restart:
    """Learn whether this group is a restarted one (a collective: every rank calls it once the group
    has formed; ``init_distributed`` does).

    Slurm's SLURM_RESTART_COUNT is the same on every task. Under torchrun only the agent whose worker
    failed counts a restart (TORCHELASTIC_RESTART_COUNT); the agents that merely followed it into a new
    rendezvous keep their count, so the highest count of all ranks says it for the whole group."""
    global _restart
    requeues = int(os.environ.get('SLURM_RESTART_COUNT') or 0)
    if requeues:
        _restart = Restart(requeues, 'Slurm requeue')
    if int(os.environ.get('TORCHELASTIC_MAX_RESTARTS') or 0) > 0:
        counts = collectives.gather_objects(int(os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0))
        if max(counts):
            _restart = Restart(max(counts), 'elastic restart')
    return _restart


def restart() -> Restart:
    """This process's group's restart count, as ``agree_on_restart`` found it ((0, '') before)."""
    return _restart
