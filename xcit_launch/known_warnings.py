"""Silence the pinned stack's known deprecation warnings, by message, so that real ones show.

Standard library only: ``xcit_dense`` and the launch preflight call it before anything imports mmengine.
"""
import logging
import warnings

# (category, start of the message) of warnings the pinned versions emit on every run
KNOWN_WARNINGS = (
    (UserWarning, 'pkg_resources is deprecated as an API'),  # mmengine's package_utils, setuptools 81
)
# mmengine's print_log deprecation notices (logged, not warned) that its own code triggers
KNOWN_LOG_MESSAGES = (
    '"FileClient" will be deprecated in future',
    '"HardDiskBackend" is the alias of "LocalBackend"',
    # the stock inferencers look their collate function up in a scope without a function registry;
    # MMEngine's, which they then use, is the right one
    'Failed to search registry with scope "mmdet" in the "function" registry tree',
    'Failed to search registry with scope "mmseg" in the "function" registry tree',
)


class KnownLogMessages(logging.Filter):
    """Drop the known mmengine deprecation notices from a logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(KNOWN_LOG_MESSAGES)


def silence_known_warnings() -> None:
    """Ignore exactly the known warnings; every other warning is shown as before."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings('ignore', message=message, category=category)
