"""Resuming a training run: which checkpoint it continues from, read once.

A run continues from a checkpoint when ``--resume`` asks for it (without a path: the newest checkpoint
of the work dir that loads, by the progress its meta records; rank 0 chooses for all ranks), or by
itself when its process group was started again after a failure (torchrun ``--max-restarts``, a
requeued Slurm job: engine/distributed/restart.py). Each candidate is judged whole before anything is restored
(io/checkpoint_schema.py: every value typed, the scan reading no tensor's data; then engine/training/resume_fit.py:
its weights, optimizer state and schedulers against those the config builds), and a candidate that fails
is skipped for the next. The chosen file is read whole once, by ``io.weights.read_checkpoint``,
whose contents hold no config text (MMEngine's ``Runner.resume`` runs a ``meta['config']`` as Python,
and copies the message hub's runtime info into the run's):
the seed, the check against the model, the Runner's resume (``ToolkitRunner.hand_checkpoint``) and the
hooks that keep state in checkpoints (their ``after_load_checkpoint``) all use that one read. ``last_checkpoint``, the
pointer MMEngine's own ``resume=True`` follows, is written here too.
"""
import glob
import logging
import os
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import print_log

from ...io.checked_unpickler import MAX_REASON
from ...io.checkpoint import AtomicLocalBackend, CheckpointError, read_without_data
from ...io.checkpoint_schema import check_resumable, seed_of
from ...io.weights import read_checkpoint
from ..distributed import collectives
from ..distributed.restart import restart
from ..distributed.run_context import Restart
from .data_position import Progress, progress_of
from .resume_fit import ResumeFit

__all__ = ['Resume', 'judge_candidate', 'read_named_checkpoint', 'read_resumable_checkpoint', 'seed_from_checkpoint',
           'write_pointer']


def write_pointer(work_dir: str, checkpoint: str) -> None:
    """Point ``last_checkpoint`` (what MMEngine's auto-resume reads) at ``checkpoint``, atomically."""
    AtomicLocalBackend().put_text(checkpoint, os.path.join(work_dir, 'last_checkpoint'))


CHECKPOINT_NAME = re.compile(r'(?:iter|epoch)_\d+\.pth$')  # the training checkpoints (not best_*)


def judge_candidate(path: str) -> Progress:
    """How far the run of the checkpoint ``path`` got (``data_position.progress_of``), once the whole
    checkpoint is judged fit to resume from (``checkpoint_schema.check_resumable``: meta, state dict,
    message hub, optimizer, schedulers), read without its tensors' data (``read_without_data``: never
    memory-mapped). Raises CheckpointError (SchemaError included) naming the file."""
    return progress_of(check_resumable(read_without_data(path), path)['meta'])


def _newest_first(work_dir: str) -> Tuple[List[str], List[str]]:
    """The training checkpoints of a work dir (absolute paths), the furthest run first, and what
    kept others out.

    How far a checkpoint's run got is read from its ``meta`` (:func:`judge_candidate`), never from the
    number in its name: ``epoch_N`` and ``iter_N`` count different things, and a
    preemption's ``iter_N`` may be older than an epoch's checkpoint written after it. A file that
    fails in any way (refused, damaged, a value not of the type a resume needs) is reported, naming it
    and the reason, and skipped; the modification time breaks ties."""
    folder = os.path.abspath(work_dir)
    ranked, problems = [], []
    for path in glob.glob(os.path.join(glob.escape(folder), '*.pth')):
        if not CHECKPOINT_NAME.search(os.path.basename(path)):
            continue
        try:
            ranked.append((judge_candidate(path), os.path.getmtime(path), path))
        except Exception as exc:  # noqa: BLE001  (any failure of one candidate: the next one is tried)
            problems.append(_skipped(path, exc))
    ranked.sort(reverse=True)
    return [path for _, _, path in ranked], problems


def _skipped(path: str, exc: Exception) -> str:
    """Log that the checkpoint ``path`` is skipped, and why (the reason's first line, bounded); the reason."""
    text = str(exc).strip()
    reason = text.splitlines()[0][:MAX_REASON] if text else type(exc).__name__
    problem = reason if path in reason else f'checkpoint {path}: {reason}'
    print_log(f'{problem}; trying an older checkpoint', logger='current', level=logging.WARNING)
    return problem


def read_fitting(path: str, fit: Optional[ResumeFit]) -> dict:
    """The checkpoint ``path`` read whole, its values typed (``check_resumable``: the file may have changed
    since the scan) and, given ``fit``, judged against the run's model, optimizer and schedulers. Raises
    CheckpointError (SchemaError included) naming the file."""
    checkpoint = check_resumable(read_checkpoint(path), path)
    if fit is not None:
        fit.check(path, checkpoint)
    return checkpoint


def _read_newest(work_dir: str, fit: Optional[ResumeFit]) -> Optional[Tuple[str, dict]]:
    """The newest checkpoint of ``work_dir`` that reads whole (and fits, given ``fit``), and its contents;
    None when there is none at all. Raises CheckpointError when checkpoints exist but none can be used."""
    paths, problems = _newest_first(work_dir)
    if paths and fit is not None:
        fit.build()  # (outside the candidates' trial: a config that builds nothing is not theirs to skip)
    for path in paths:
        try:
            checkpoint = read_fitting(path, fit)
        except Exception as exc:  # noqa: BLE001  (any failure of one candidate: the next one is tried)
            problems.append(_skipped(path, exc))
            continue
        if problems:
            print_log(f'resuming from {path}, the newest checkpoint that loads', logger='current',
                      level=logging.WARNING)
        return path, checkpoint
    if problems:
        raise CheckpointError(f'no checkpoint in {work_dir} can be loaded: ' + '; '.join(problems))
    return None


def read_resumable_checkpoint(work_dir: str, fit: Optional[ResumeFit] = None) -> Optional[Tuple[str, dict]]:
    """The newest checkpoint of ``work_dir`` that loads (and, given ``fit``, fits the run), and its
    contents; None when there is none at all.

    Rank 0 chooses, and every rank resumes from its choice (a collective: on a shared file system
    with client caching, ranks could see different files). Checkpoints that cannot be used are reported
    and skipped; if checkpoints exist but none can, this raises (on every rank) rather than letting
    the run start from scratch.
    """
    return _chosen_by_first(lambda: _read_newest(work_dir, fit))


def read_named_checkpoint(path: str, fit: Optional[ResumeFit] = None) -> Tuple[str, dict]:
    """The checkpoint ``--resume PATH`` names, read and judged as :func:`read_resumable_checkpoint` judges a
    candidate (on rank 0, the verdict broadcast), and its contents. Raises CheckpointError or
    FileNotFoundError on every rank."""
    return _chosen_by_first(lambda: (path, read_fitting(path, fit)))


def _chosen_by_first(choose: Callable[[], Optional[Tuple[str, dict]]]) -> Optional[Tuple[str, dict]]:
    """``choose()`` run on rank 0 only (it builds and reads on the CPU), its path or error given to every
    rank (rank 0 raises its own; the others a CheckpointError or FileNotFoundError of its text, never left
    waiting); the other ranks read the chosen file's contents themselves (typed again)."""
    found, failure = None, None
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            found = choose()
        except Exception as exc:
            failure = exc
    error = (type(failure).__name__, str(failure)) if failure is not None else None
    path, error = collectives.broadcast_from_first((found[0] if found else None, error))
    if failure is not None:
        raise failure
    if error:
        raise (FileNotFoundError if error[0] == 'FileNotFoundError' else CheckpointError)(error[1])
    if path is None:
        return None
    return found or (path, check_resumable(read_checkpoint(path), path))


def seed_from_checkpoint(cfg: Config, checkpoint: dict) -> None:
    """A config without a seed resumes under the seed of ``checkpoint`` (its read contents), set
    before the Runner exists.

    MMEngine re-seeds from the checkpoint only after it has built the training dataloader,
    whose sampler order and worker seeds would then come from a new random seed.
    """
    randomness = dict(cfg.get('randomness') or {})
    if randomness.get('seed') is not None:
        return
    seed = seed_of(checkpoint['meta'])  # checked with the rest before the choice (check_resumable)
    if seed is not None:
        cfg.randomness = dict(randomness, seed=seed)


@dataclass
class Resume:
    """Where a training run starts: a checkpoint (its path and contents, read once) or the beginning."""

    asked: Optional[str]  # --resume: 'auto', a path, or None
    restart: Restart
    path: Optional[str] = None
    checkpoint: Optional[dict] = None  # held until the Runner has it

    @classmethod
    def choose(cls, work_dir: str, asked: Optional[str], fit: Optional[ResumeFit] = None) -> 'Resume':
        """Decide what to resume from, and read it. A restarted group continues from the newest
        checkpoint of the work dir (that fits the run, given ``fit``), or else from the one ``--resume``
        names; ``--resume`` alone takes the newest (none yet: the beginning). Raises CheckpointError or
        FileNotFoundError."""
        restarted = restart()
        if restarted.count:  # as if --resume were given: the newest checkpoint first
            asked = asked or 'auto'
        resume = cls(asked, restarted)
        found = None
        if restarted.count or asked == 'auto':
            found = read_resumable_checkpoint(work_dir, fit)
        if found is None and asked not in (None, 'auto'):
            found = read_named_checkpoint(asked, fit)
        if found:
            resume.path, resume.checkpoint = found
        return resume

    def configure(self, cfg: Config) -> None:
        """Point the config at the checkpoint (``resume``, ``load_from``), under its seed if the config has none."""
        if self.path:
            cfg.resume, cfg.load_from = True, self.path
            seed_from_checkpoint(cfg, self.checkpoint)

    def hand_to(self, runner) -> None:
        """Give the read checkpoint (judged to fit when chosen) to the Runner for its resume (a Runner other
        than ToolkitRunner reads the file again)."""
        if not self.path:
            return
        if hasattr(runner, 'hand_checkpoint'):
            runner.hand_checkpoint(self.path, self.checkpoint)
        self.checkpoint = None  # the Runner's now: dropped once it has loaded it

    def describe_starting_point(self, work_dir: str) -> List[str]:
        """The log lines that say where the run continues from."""
        lines = []
        if self.restart.count:
            how = 'torchrun --max-restarts' if self.restart.by == 'elastic restart' else 'SLURM_RESTART_COUNT'
            lines.append(f'{self.restart.by} {self.restart.count} of the group ({how}): resuming '
                         f'from {self.path or "the beginning (no complete checkpoint yet)"}')
        if self.asked and not self.path:
            lines.append(f'--resume: no checkpoint in {work_dir} yet, starting from the beginning')
        return lines
