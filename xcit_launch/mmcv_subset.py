"""Cut mmcv 2.1.0's source down to a few ops before it is compiled, for tools/misc/build_mmcv.py --ops.

mmcv has no subset option: setup.py compiles every file its globs find (77 C++ files, 58 CUDA
ones, about 58 core-minutes with CUDA). The check on a lent GPU machine needs nms and RoIAlign
only (mmdet's Mask R-CNN calls no other compiled op), so the files of the other ops are deleted
and the two files that name every op are filtered: pybind.cpp (one ``m.def`` per function) and
cuda/cudabind.cpp (per op: launcher declarations, wrappers, ``REGISTER_DEVICE_IMPL``). mmcv's
``load_ext`` asserts at import that every function an op module names exists; it is patched so
that a function left out becomes one that raises, naming the op and how to get it.
"""
import re
from pathlib import Path
from typing import Iterable

# Each op: its source stem (pytorch/<s>.cpp, pytorch/cpu/<s>.cpp, pytorch/cuda/<s>_cuda.cu) and the
# functions of mmcv._ext it defines.
OPS = {
    'nms': ('nms', 'softnms', 'nms_match'),
    'roi_align': ('roi_align_forward', 'roi_align_backward'),
}
ALWAYS = ('get_compiler_version', 'get_compiling_cuda_version')  # pytorch/info.cpp, read by mmcv itself
KEPT_FILES = ('pybind.cpp', 'info.cpp', 'cudabind.cpp')
REGISTER = re.compile(r'REGISTER_DEVICE_IMPL\(\s*(\w+)\s*,', re.S)
MDEF = re.compile(r'^\s*m\.def\(\s*"(\w+)"')
LOAD_EXT_ASSERT = "            assert hasattr(ext, fun), f'{fun} miss in module {name}'\n"


def parse_ops(text: str) -> tuple[str, ...]:
    """The ops named in --ops ("nms,roi_align"), sorted and unique; ValueError for an unknown one."""
    ops = sorted({op.strip() for op in text.split(',') if op.strip()})
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise ValueError(f'--ops must name some of {", ".join(OPS)}; got {text!r}')
    return tuple(ops)


def _split_after(text: str, end: re.Pattern) -> list[str]:
    """Split text into chunks each ending just after a run of statements matched by ``end``."""
    chunks, start = [], 0
    for m in end.finditer(text):
        chunks.append(text[start:m.end()])
        start = m.end()
    return chunks + [text[start:]]


def filter_cudabind(text: str, ops: Iterable[str]) -> str:
    """cudabind.cpp with only the blocks (declarations, wrappers, registrations) of ``ops``."""
    impls = {f'{op}_impl' for op in ops} | {f'{op}_forward_impl' for op in ops} | \
        {f'{op}_backward_impl' for op in ops}
    includes = ''.join(line for line in text.splitlines(keepends=True) if line.startswith('#include'))
    body = ''.join(line for line in text.splitlines(keepends=True) if not line.startswith('#include'))
    run_end = re.compile(r'(?:\s*REGISTER_DEVICE_IMPL\([^;]*\);)+\n')
    kept = [chunk for chunk in _split_after(body, run_end) if set(REGISTER.findall(chunk)) & impls]
    return includes + ''.join(kept)


def filter_pybind(text: str, functions: Iterable[str]) -> str:
    """pybind.cpp whose module defines only ``functions`` (the declarations stay: they cost nothing)."""
    head, sep, body = text.partition('PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n')
    if not sep:
        raise ValueError('pybind.cpp has no PYBIND11_MODULE block: unexpected mmcv source')
    statements = re.findall(r'\s*m\.def\(.*?\);\n', body, re.S)
    wanted = set(functions)
    kept = [s for s in statements if MDEF.match(s) and MDEF.match(s).group(1) in wanted]
    return head + sep + ''.join(kept) + '}\n'


def left_out_module(ops: tuple[str, ...]) -> str:
    """mmcv/xcit_left_out.py: what a function of an op left out of the build does when called."""
    return (
        '"""Written by xcit-dense\'s tools/misc/build_mmcv.py --ops: this mmcv was compiled with some ops only."""\n'
        f'BUILT_OPS = {ops!r}\n\n\n'
        'def left_out(name):\n'
        '    """A stand-in for mmcv._ext.<name>, which this build does not hold: it raises when called."""\n'
        '    def call(*args, **kwargs):\n'
        '        raise NotImplementedError(\n'
        '            f"mmcv\'s compiled op function {name!r} was left out of this build, which holds the ops "\n'
        '            f"{\', \'.join(BUILT_OPS)} only (tools/misc/build_mmcv.py --ops); build mmcv without --ops "\n'
        '            "for all of them")\n'
        '    call.__name__ = name\n'
        '    return call\n')


def cut_source(src: Path, ops: tuple[str, ...]) -> list[Path]:
    """Reduce the extracted mmcv source at src to ``ops``; return the compiled sources left."""
    csrc = src / 'mmcv' / 'ops' / 'csrc' / 'pytorch'
    keep = set(KEPT_FILES) | {f'{op}.cpp' for op in ops} | {f'{op}_cuda.cu' for op in ops}
    for folder in (csrc, csrc / 'cpu', csrc / 'cuda'):
        for path in list(folder.glob('*.cpp')) + list(folder.glob('*.cu')):
            if path.name not in keep:
                path.unlink()
    functions = [f for op in ops for f in OPS[op]] + list(ALWAYS)
    (csrc / 'pybind.cpp').write_text(filter_pybind((csrc / 'pybind.cpp').read_text(), functions))
    cudabind = csrc / 'cuda' / 'cudabind.cpp'
    cudabind.write_text(filter_cudabind(cudabind.read_text(), ops))
    loader = src / 'mmcv' / 'utils' / 'ext_loader.py'
    text = loader.read_text()
    if LOAD_EXT_ASSERT not in text:
        raise ValueError(f'{loader} has no load_ext assertion to patch: unexpected mmcv source')
    loader.write_text(text.replace(LOAD_EXT_ASSERT, (
        '            if not hasattr(ext, fun):  # xcit-dense: an op left out of this build raises when called\n'
        '                from mmcv.xcit_left_out import left_out\n'
        '                setattr(ext, fun, left_out(fun))\n')))
    (src / 'mmcv' / 'xcit_left_out.py').write_text(left_out_module(ops))
    return sorted(p for folder in (csrc, csrc / 'cpu', csrc / 'cuda') for p in folder.glob('*.c[pu]*'))
