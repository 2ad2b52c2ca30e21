"""tools/deployment/infer_onnx.py run where torch and OpenMMLab cannot be imported: the deployment's promise
(onnxruntime, numpy and OpenCV only) checked in the process that runs it."""
import subprocess
import sys

from helpers import ROOT

# imported by none of the tool's modules: each raises ImportError in the tool's process
BLOCKED = ('torch', 'torchvision', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'xcit_dense', 'PIL')
RUN_BLOCKED = f'''
import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BLOCKED!r}:
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Blocked())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def run_infer_onnx(*args, cwd) -> subprocess.CompletedProcess:
    """``python tools/deployment/infer_onnx.py ARGS`` with BLOCKED's packages unimportable."""
    tool = str(ROOT / 'tools/deployment/infer_onnx.py')
    return subprocess.run([sys.executable, '-c', RUN_BLOCKED, tool, *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)
