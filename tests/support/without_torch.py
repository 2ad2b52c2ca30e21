"""tools/deployment/infer_onnx.py run where torch and OpenMMLab cannot be imported: the deployment's promise
(onnxruntime, numpy and OpenCV only) checked in the process that runs it."""
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

from helpers import ROOT
from pycocotools import mask as mask_utils

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


def detection_results(out: Path, classes: Sequence[str]) -> List[dict]:
    """infer_onnx.py's ``results.json`` in ``out`` for a detection file of ``classes``: each instance named
    by its label, scored in (0, 1], its box inside its image and its mask pasted at the image's size; the
    images' entries."""
    results = json.loads((out / 'results.json').read_text())
    assert results['task'] == 'detection' and results['classes'] == list(classes)
    for result in results['images']:
        height, width = result['height'], result['width']
        for instance in result['instances']:
            assert instance['class'] == classes[instance['label']] and 0 < instance['score'] <= 1
            x1, y1, x2, y2 = instance['bbox']
            assert 0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height, instance['bbox']
            mask = mask_utils.decode(dict(instance['mask'], counts=instance['mask']['counts'].encode()))
            assert mask.shape == (height, width)
    return results['images']
