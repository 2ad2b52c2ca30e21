"""Whether a C compiler is at hand for ``torch.compile``.

Installing the toolkit compiles nothing, but ``torch.compile`` still needs a C compiler at run
time: inductor builds C++ for CPUs and Triton builds its launchers for GPUs. Without one the
first compiled call fails deep inside inductor; the backbone asks here first and runs eagerly.
"""
import functools
import os
import shutil
from typing import Optional

# what inductor (CXX, g++) and Triton (CC, gcc, clang) look for, and the usual system names
COMPILER_VARIABLES = ('CXX', 'CC')
COMPILER_NAMES = ('g++', 'gcc', 'clang++', 'clang', 'c++', 'cc')


def find_c_compiler() -> Optional[str]:
    """The path of the first compiler named by CXX, CC or found on PATH; None when there is none."""
    return _find(tuple(os.environ.get(name, '') for name in COMPILER_VARIABLES), os.environ.get('PATH', ''))


@functools.lru_cache(maxsize=8)
def _find(named: tuple, path: str) -> Optional[str]:
    for name in (*(n.split()[0] for n in named if n.strip()), *COMPILER_NAMES):
        found = shutil.which(name, path=path)
        if found:
            return found
    return None
