"""Inference on awkward inputs: extreme sizes and aspect ratios, grayscale, RGBA, 16-bit PNG, a JPEG
whose header declares 40000x40000 pixels."""
import json

import numpy as np
from bad_data import jpeg_declaring
from helpers import run_tool_in_process
from PIL import Image


def test_awkward_images_give_outputs_or_clear_errors(tmp_path, tiny_seg_run):
    config, work_dir = tiny_seg_run
    images = tmp_path / 'images'
    images.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (17, 2000, 3), dtype=np.uint8)).save(images / 'thin.png')
    Image.fromarray(rng.integers(0, 255, (2000, 3000, 3), dtype=np.uint8)).save(images / 'huge.jpg')
    Image.fromarray(rng.integers(0, 255, (50, 70), dtype=np.uint8)).save(images / 'gray.png')
    Image.fromarray(rng.integers(0, 255, (50, 70, 4), dtype=np.uint8), 'RGBA').save(images / 'rgba.png')
    Image.fromarray(rng.integers(0, 65535, (50, 70), dtype=np.uint16)).save(images / 'deep.png')
    (images / 'notes.txt').write_text('not an image')
    jpeg_declaring(images / 'bomb.jpg', 40000, 40000)  # OpenCV's own limit raised cv2.error: infer aborted
    proc = run_tool_in_process('tools/infer.py', config, work_dir / 'iter_4.pth', images,  # no process of its own
                               '--out-dir', tmp_path / 'out', cwd=tmp_path)
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    # the weights named once: the toolkit's line, not MMEngine's bare "Loads checkpoint by local backend"
    assert f'weights: {work_dir / "iter_4.pth"} (trained without an average)' in proc.stderr
    assert 'Loads checkpoint by' not in proc.stdout + proc.stderr
    results = {r['image'].split('/')[-1]: r for r in json.loads((tmp_path / 'out/results.json').read_text())['images']}
    for name, (h, w) in {'thin.png': (17, 2000), 'huge.jpg': (2000, 3000), 'gray.png': (50, 70),
                         'rgba.png': (50, 70), 'deep.png': (50, 70)}.items():
        assert (results[name]['height'], results[name]['width']) == (h, w), name
        assert (tmp_path / 'out' / (name.rsplit('.', 1)[0] + '.png')).exists(), name
    assert Image.open(tmp_path / 'out/gray.png').size == (538, 384)  # 50 x 70 enlarged to --min-size 384
    assert Image.open(tmp_path / 'out/thin.png').size == (2048, 17)  # not past --max-size: 17 x 2000 stays small
    assert 'error' in results['notes.txt'] and proc.returncode == 1
    assert 'images over the pixel limit: its header declares 40000x40000 pixels' in results['bomb.jpg']['error']
    assert 'rgba.png' in results and 'thin.png' in results  # the images after it were processed
