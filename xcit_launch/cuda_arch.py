"""Which TORCH_CUDA_ARCH_LIST entries run on which GPU: the one rule shared by the mmcv build and
the run-time check of its ops (standard library only: the build runs before the package installs)."""
import re
from typing import Optional, Sequence

ARCH = re.compile(r'^(\d+)\.(\d+)(\+PTX)?$')


def parse_arch_list(text: str) -> tuple[str, ...]:
    """Normalise a TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", spaces or commas too), sorted and unique."""
    archs = set()
    for item in re.split(r'[;,\s]+', text.strip()):
        if not item:
            continue
        if not ARCH.match(item):
            raise ValueError(f'TORCH_CUDA_ARCH_LIST entry {item!r} is not of the form 8.0 or 9.0+PTX')
        archs.add(item)
    if not archs:
        raise ValueError('TORCH_CUDA_ARCH_LIST is empty')
    return tuple(sorted(archs, key=lambda a: tuple(int(x) for x in ARCH.match(a).group(1, 2)) + (a,)))


def arch_runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code for one TORCH_CUDA_ARCH_LIST entry runs on a GPU of this compute capability.

    cubin for sm_XY runs on the same major X with minor >= Y; an entry with +PTX also carries
    PTX, which the driver compiles for any newer GPU.
    """
    m = ARCH.match(arch)
    if not m:
        return False
    built = (int(m.group(1)), int(m.group(2)))
    if capability[0] == built[0] and capability[1] >= built[1]:
        return True
    return bool(m.group(3)) and tuple(capability) >= built


def arch_mismatch_message(capability: tuple[int, int], gpu_name: str, archs: Sequence[str]) -> Optional[str]:
    """The error for a GPU none of the built architectures runs on, None when one does."""
    if any(arch_runs_on(a, capability) for a in archs):
        return None
    sm = f'sm_{capability[0]}{capability[1]}'
    built = ', '.join('sm_' + a.replace('.', '').replace('+PTX', ' (+PTX)') for a in archs)
    wanted = ';'.join(list(archs) + [f'{capability[0]}.{capability[1]}'])
    return (f"this GPU is {sm} ({gpu_name}), but the installed mmcv's CUDA ops were built for {built}: "
            f'reinstall with XCIT_MMCV=compiled XCIT_MMCV_CUDA=1 TORCH_CUDA_ARCH_LIST="{wanted}" bash tools/install.sh')
