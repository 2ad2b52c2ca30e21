"""Weights as users get them now, through the tools: a trained model's weights as a safetensors file in
a Hugging Face Hub cache, named ``hf-hub:OWNER/NAME``, read offline."""
import json
import re

from helpers import cached_hub_repo, run_tool_in_process
from safetensors.torch import save_file

from xcit_dense.io.weights import read_checkpoint


def test_test_tool_evaluates_a_trained_model_by_its_hub_name(tmp_path, trained_tiny_seg, offline_hub_cache):
    """The trained work dir's last weights, published as ``model.safetensors`` in a hub cache, score what the
    run's own validation of those weights scored (tools/test.py on the same images)."""
    config, work_dir = trained_tiny_seg
    state = read_checkpoint(str(work_dir / 'iter_4.pth'))['state_dict']
    cached_hub_repo(offline_hub_cache, 'someone/tiny-seg', {
        'model.safetensors': lambda path: save_file({k: v.contiguous() for k, v in state.items()}, path)})
    proc = run_tool_in_process('tools/test.py', config, 'hf-hub:someone/tiny-seg', '--work-dir', tmp_path / 'eval',
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'models--someone--tiny-seg/snapshots/' in proc.stdout and 'model.safetensors' in proc.stdout
    validated = json.loads(next(work_dir.glob('*/vis_data/scalars.json')).read_text().splitlines()[-1])
    tested = float(re.findall(r'mIoU: ([0-9.]+)', proc.stdout)[-1])
    assert tested == round(validated['mIoU'], 2)
