"""Project code is imported, never loaded by path, and the launch helpers (xcit_launch) import
neither torch nor mmengine where they need neither."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

# Loading a file by path: importlib's file loaders, imp's, and runpy.run_path other than running a
# script as __main__ (a tool, or mmdet's own, run in-process stays fine).
BY_PATH = re.compile(r'spec_from_file_location|SourceFileLoader|load_source\(|run_path\(')
RUN_AS_MAIN = re.compile(r'''run_path\([^\n]*run_name=['"]__main__['"]''')
SCANNED = ('tools/**/*.py', 'xcit_dense/**/*.py', 'xcit_launch/**/*.py', 'gpu_check/**/*.py', 'tests/**/*.py')
# stdlib-only modules (onnx_segmentation, onnx_detection: numpy, OpenCV and onnxruntime); preflight imports mmengine's
# Config and nothing heavier
LIGHT = ('netif', 'torchrun', 'known_warnings', 'cuda_arch', 'mmcv_build', 'mmcv_subset', 'linkless_writes',
         'image_names', 'decode_work', 'onnx_segmentation', 'onnx_detection', 'launch_layout')
# the GPU check's modules that run on a lent machine before the stack is installed
GPU_CHECK_LIGHT = ('bounded', 'device_check', 'bundle')


def loads_by_path(text: str) -> list:
    """The lines of ``text`` that load a file by path (in code, or in code it writes or runs)."""
    return [f'{n}: {line.strip()}' for n, line in enumerate(text.splitlines(), 1)
            if BY_PATH.search(line) and not RUN_AS_MAIN.search(line)]


def test_the_scan_finds_loading_by_path():
    assert loads_by_path("spec = importlib.util.spec_from_file_location('t', ROOT / 'tools/x.py')")
    assert loads_by_path("SourceFileLoader('t', path).load_module()")
    assert loads_by_path("globals().update(runpy.run_path('tools/x.py'))")
    assert not loads_by_path("runpy.run_path(tool, run_name='__main__')")
    assert not loads_by_path('from xcit_launch import netif')


def test_no_project_file_is_loaded_by_path():
    files = sorted({p for pattern in SCANNED for p in ROOT.glob(pattern)} - {Path(__file__).resolve()})
    assert len(files) > 100  # the globs do find the project
    offenders = {str(p.relative_to(ROOT)): found for p in files if (found := loads_by_path(p.read_text()))}
    assert not offenders, offenders


@pytest.mark.parametrize('name', LIGHT + ('preflight',) + tuple(f'gpu_check.{n}' for n in GPU_CHECK_LIGHT))
def test_a_launch_helper_imports_neither_torch_nor_mmengine(name):
    heavy = ('torch', 'mmdet', 'mmseg', 'mmcv') + (() if name == 'preflight' else ('mmengine',))
    module = name if '.' in name else f'xcit_launch.{name}'
    code = (f'import json, sys; import {module}; '
            f'print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})))')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
