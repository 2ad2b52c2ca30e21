"""Silence the pinned stack's known deprecation warnings, by message, so that real ones show.

Standard library only: ``xcit_dense`` and the launch preflight call it before anything imports mmengine.
"""
import logging
import re
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator, TextIO

# (category, start of the message) of warnings the pinned versions emit on every run
KNOWN_WARNINGS = (
    (UserWarning, 'pkg_resources is deprecated as an API'),  # mmengine's package_utils, setuptools 81
    # MMEngine's notices that it gives each process of a launched run one OpenMP / MKL thread where
    # the variable is unset (torchrun does the same for OpenMP): the toolkit launches one process
    # per core or GPU and keeps that setting on purpose; set the variables to choose another
    (UserWarning, 'Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, '),
    (UserWarning, 'Setting MKL_NUM_THREADS environment variable for each process to be 1 in default, '),
    # mmseg's decode heads build their losses with its own deprecated build_loss: nothing to change here
    (UserWarning, '``build_loss`` would be deprecated soon, please use ``mmseg.registry.MODELS.build()``'),
    # mmseg's notice about its cross-entropy default: the recipes keep it, as the published models had
    (UserWarning, 'Default ``avg_non_ignore`` is False, if you would like to ignore the certain label'),
    # mmseg's visualization hook off by default (draw=False), as the toolkit sets it: tools/infer.py draws
    (UserWarning, 'The draw is False, it means that the hook for visualization will not take effect.'),
    # torchvision's NMS registration for the exporter, once per NMS an export traces (a Mask R-CNN's)
    (FutureWarning, '`create_unbacked_symint` is deprecated, please use `new_dynamic_size` instead'),
)
# mmengine's print_log deprecation notices (logged, not warned) that its own code triggers
KNOWN_LOG_MESSAGES = (
    '"FileClient" will be deprecated in future',
    '"HardDiskBackend" is the alias of "LocalBackend"',
    # the stock inferencers look their collate function up in a scope without a function registry;
    # MMEngine's, which they then use, is the right one
    'Failed to search registry with scope "mmdet" in the "function" registry tree',
    'Failed to search registry with scope "mmseg" in the "function" registry tree',
    # mmseg's IoUMetric has no default prefix: its figures keep the names 'aAcc', 'mIoU' and 'mAcc'
    # that mmseg's own configs log and users' scripts read, as the toolkit's configs leave them
    'The prefix is not set in metric class IoUMetric.',
    # the prediction dumps that tools/test.py --out adds (mmdet's own test.py adds the same) report no
    # figure, so a prefix would name nothing; their constructors take none
    'The prefix is not set in metric class DumpDetResults.',
    'The prefix is not set in metric class DumpResults.',
    # MMEngine's iteration loop announcing its resume skip, which the toolkit's loop answers without
    # loading a batch (engine/training/loops.py logs where the data continues)
    'Advance dataloader ',
)

# what MMEngine prints bare on stdout (print_log without a logger): its checkpoint reader's notice before
# each read of a local file, beside the toolkit's own line naming the weights used (and the Runner's
# "Load checkpoint from PATH")
KNOWN_PRINTED = ('Loads checkpoint by local backend from path: ',)


class KnownLogMessages(logging.Filter):
    """Drop the known mmengine deprecation notices from a logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(KNOWN_LOG_MESSAGES)


def silence_known_warnings() -> None:
    """Ignore exactly the known warnings; every other warning is shown as before."""
    for category, message in KNOWN_WARNINGS:  # the start of the message, as written (not a pattern)
        warnings.filterwarnings('ignore', message=re.escape(message), category=category)


class _WithoutKnownLines:
    """A text stream that passes on every line written to it but those starting with ``KNOWN_PRINTED``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.pending = stream, ''

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split('\n')
        for line in lines:
            if not line.startswith(KNOWN_PRINTED):
                self.stream.write(line + '\n')
        return len(text)

    def flush(self) -> None:
        """Pass on what is written of a line (a progress bar) too."""
        self.stream.write(self.pending)
        self.pending = ''
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def without_known_prints() -> Iterator[None]:
    """Within: the known notices MMEngine prints bare (``KNOWN_PRINTED``) are dropped from stdout."""
    stdout = sys.stdout
    sys.stdout = _WithoutKnownLines(stdout)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = stdout
