"""The meta-path finder that makes ``mmcv._ext`` importable when mmcv-lite is installed.

Why a finder installed by a ``.pth`` file of this distribution (``xcit_mmcv_ext.pth``, one line
calling ``install()`` at interpreter start), and not a file placed into mmcv-lite's folder:
a file in ``mmcv/`` belongs to no distribution's record, so reinstalling mmcv-lite drops it and
uninstalling the toolkit leaves it behind; the ``.pth`` file is in this distribution's record, so
it survives any mmcv reinstall and goes with ``pip uninstall xcit-dense``. The finder comes after
Python's own path finder: a compiled mmcv's real ``_ext`` extension is found first and wins.
It gives a real spec with a file location, so ``pkgutil.find_loader('mmcv._ext')`` (mmengine's
``mmcv_full_available()``) and ``inspect`` work as with mmcv's own module.
It runs in every process started from the environment, so it imports what Python's start has
already imported and little else (no typing, importlib.abc or pathlib: about 2 ms, not 29).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

MODULE = 'mmcv._ext'
SERVED_MMCV = '2.1.'  # the mmcv release whose ops' arguments and semantics ext_module serves
EXT_MODULE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ext_module.py')
REINSTALL = 'bash tools/install.sh'


class ExtModuleLoader(importlib.machinery.SourceFileLoader):
    """Loads ext_module.py as ``mmcv._ext``; a failure says which module failed and how to repair."""

    def exec_module(self, module: ModuleType) -> None:
        try:
            super().exec_module(module)
        except ImportError as error:
            raise ImportError(f"{MODULE} is served by xcit-dense from torchvision's kernels "
                              f"({EXT_MODULE_FILE}), and loading it failed: {error}. "
                              f'Repair the environment with: {REINSTALL}') from error


class MmcvExtFinder:
    """Finds ``mmcv._ext`` (and nothing else) in this package, for mmcv 2.1.x without its own
    (a meta-path finder: ``find_spec`` is its protocol)."""

    def find_spec(self, fullname: str, path: list[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        version = getattr(sys.modules.get('mmcv'), '__version__', None)
        if version is None or not version.startswith(SERVED_MMCV):
            raise ImportError(f"xcit-dense serves {MODULE} for mmcv {SERVED_MMCV}x, but mmcv {version} "
                              f'is installed without its compiled ops. Repair the environment with: {REINSTALL}')
        return importlib.util.spec_from_file_location(
            fullname, EXT_MODULE_FILE, loader=ExtModuleLoader(fullname, EXT_MODULE_FILE))


def install() -> None:
    """Append the finder to ``sys.meta_path`` once (after the path finder: a compiled _ext wins)."""
    if not any(isinstance(finder, MmcvExtFinder) for finder in sys.meta_path):
        sys.meta_path.append(MmcvExtFinder())


def serves_mmcv_ext() -> bool:
    """Whether ``mmcv._ext`` is this package's (mmcv-lite installed), not a compiled mmcv's own."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except ImportError:
        return False
    return spec is not None and spec.origin == EXT_MODULE_FILE
