"""Whether this process's group is a restarted one: the agreement the ranks reach once the group has
formed (``dist.init_distributed``), kept in the run's context and read when the run chooses what to
resume from (engine/training/resume.py)."""
import os

from . import collectives
from .run_context import Restart, current_context


def agree_on_restart() -> Restart:
    """Learn whether this group is a restarted one (a collective: every rank calls it once the group
    has formed; ``init_distributed`` does), and keep the answer in the run's context.

    Slurm's SLURM_RESTART_COUNT is the same on every task. Under torchrun only the agent whose worker
    failed counts a restart (TORCHELASTIC_RESTART_COUNT); the agents that merely followed it into a new
    rendezvous keep their count, so the highest count of all ranks says it for the whole group."""
    context = current_context()
    requeues = int(os.environ.get('SLURM_RESTART_COUNT') or 0)
    if requeues:
        context.restart = Restart(requeues, 'Slurm requeue')
    if int(os.environ.get('TORCHELASTIC_MAX_RESTARTS') or 0) > 0:
        counts = collectives.gather_objects(int(os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0))
        if max(counts):
            context.restart = Restart(max(counts), 'elastic restart')
    return context.restart


def restart() -> Restart:
    """This run's group's restart count, as ``agree_on_restart`` found it ((0, '') before)."""
    return current_context().restart
