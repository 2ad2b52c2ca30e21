"""The authors' released COCO / ADE20K checkpoints (tests/support/released.py rebuilds them at tiny widths)
evaluate, fine-tune, infer and convert as released, strictly and safely."""
import pickle
import runpy
import sys

import numpy as np
import pytest
import torch
from helpers import ROOT, hide_payload, own_runner_instances
from released import SEG_CLASSES, SHAPES, manifest, released_file, released_state, tiny_config, toolkit_twin

from xcit_dense.builder import build_model
from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set
from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.weights import check_finetune_fits, check_matches_model, read_checkpoint

TASKS = ('mask_rcnn', 'sem_fpn', 'upernet')


@pytest.fixture(scope='module')
def demo_data(tmp_path_factory):
    """Two validation images of each demo set (tools/make_demo_data.py's layout)."""
    root = tmp_path_factory.mktemp('demo')
    write_coco_set(str(root / 'demo_coco'), 'val', 2, size=(64, 64), seed=1)
    write_segmentation_set(str(root / 'demo_ade'), 'validation', 2, size=(64, 64), seed=3)
    return root


def model_of(tmp_path, task, patch_size, data, **extra):
    return build_model(str(tiny_config(tmp_path, task, patch_size, data, **extra)), init=False)


def test_manifest_tensors_are_distinct():
    """Two same-shaped tensors (fpn1.0 and fpn1.3, ...) never hold the same values."""
    state = released_state('mask_rcnn', 16)
    assert not torch.equal(state['backbone.fpn1.0.weight'], state['backbone.fpn1.3.weight'])
    assert 'backbone.pos_embeder.token_projection.weight' in state and len(state) == len(manifest('mask_rcnn', 16))


@pytest.mark.parametrize('task', TASKS)
@pytest.mark.parametrize('patch_size', (8,))
def test_released_layout_loads_every_key_strictly(tmp_path, demo_data, task, patch_size):
    """Every key of the model comes from the file, under the right name and shape (the patch-16
    files: the tools/test.py comparisons below)."""
    path = released_file(tmp_path / 'released.pth', task, patch_size)
    model = model_of(tmp_path, task, patch_size, demo_data)
    check_matches_model(model, str(path))
    state = read_checkpoint(str(path))['state_dict']
    model.load_state_dict(state, strict=True)
    raw = released_state(task, patch_size)
    for key in ('backbone.fpn1.0.weight', 'backbone.blocks.3.attn.qkv.weight'):  # in every task's file
        assert torch.equal(model.state_dict()[key], raw[key]), key
    assert torch.equal(model.backbone.pos_embed.token_projection.weight,
                       raw['backbone.pos_embeder.token_projection.weight'])


def load_results(path):
    with open(path, 'rb') as f:
        return pickle.load(f)  # the toolkit's own --out file


def assert_same(a, b, where='results'):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f'{where}.{key}')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f'{where}[{i}]')
    elif isinstance(a, (torch.Tensor, np.ndarray)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), where
    else:
        assert a == b, where


def run_tool_in_process(tool: str, *args) -> None:
    """A tool of tools/ in this process (its imports already done: a subprocess takes 10 s more); its
    exit status must be 0."""
    argv = sys.argv
    sys.argv = [tool, *map(str, args)]
    try:
        with own_runner_instances():
            runpy.run_path(str(ROOT / tool), run_name='__main__')
    except SystemExit as exc:  # the tools end with sys.exit(exit_status(main))
        assert not exc.code, exc.code
    finally:
        sys.argv = argv


@pytest.mark.parametrize('task', TASKS)
def test_tools_test_gives_the_twins_predictions(tmp_path, demo_data, task, file_server, monkeypatch):
    """tools/test.py on a released file predicts exactly what the same weights in this toolkit's
    layout (mapped without the code under test) predict; the Semantic FPN file is given by URL."""
    config = tiny_config(tmp_path, task, 16, demo_data)
    state = released_state(task, 16)
    released = released_file(file_server['root'] / f'{task}_xcit.pth', task, 16, state)
    if task == 'sem_fpn':
        monkeypatch.setenv('XCIT_ALLOW_HTTP', '1')  # the loopback server has no TLS
        released = f"{file_server['url']}/{released.name}"
    files = dict(released=released, twin=toolkit_twin(tmp_path / 'twin.pth', state))
    outputs = {}
    for name, path in files.items():
        run_tool_in_process('tools/test.py', config, path, '--work-dir', tmp_path / name,
                            '--out', tmp_path / f'{name}.pkl')
        outputs[name] = load_results(tmp_path / f'{name}.pkl')
        log = next((tmp_path / name).glob('*/*.log')).read_text()
        assert ('coco/bbox_mAP' if task == 'mask_rcnn' else 'mIoU') in log
        assert 'The prefix is not set' not in log  # the --out dump's notice (xcit_launch/known_warnings.py)
    assert len(outputs['released']) == 2
    assert_same(outputs['released'], outputs['twin'])
    assert file_server['hits'] == ({f'/{task}_xcit.pth': 1} if task == 'sem_fpn' else {})


@pytest.mark.parametrize('drop, reshape, named', [
    ('roi_head.mask_head.conv_logits.weight', None, 'roi_head.mask_head.conv_logits.weight'),
    (None, 'rpn_head.rpn_reg.weight', 'rpn_head.rpn_reg.weight'),
    ('backbone.pos_embeder.token_projection.bias', None, 'backbone.pos_embed.token_projection.bias'),
])
def test_missing_or_mis_shaped_tensor_is_named(tmp_path, demo_data, drop, reshape, named):
    state = released_state('mask_rcnn', 16)
    if drop:
        del state[drop]
    if reshape:
        state[reshape] = torch.zeros(7, *state[reshape].shape[1:])
    path = released_file(tmp_path / 'bad.pth', 'mask_rcnn', 16, state)
    with pytest.raises(CheckpointError, match=named.replace('.', r'\.')):
        check_matches_model(model_of(tmp_path, 'mask_rcnn', 16, demo_data), str(path))


def test_other_backbone_names_both(tmp_path, demo_data):
    path = released_file(tmp_path / 'p8.pth', 'upernet', 8)
    with pytest.raises(CheckpointError, match='patch 8, 32 dims, 4 blocks.*patch 16, 32 dims, 4 blocks'):
        check_matches_model(model_of(tmp_path, 'upernet', 16, demo_data), str(path))


def test_code_in_a_released_file_is_refused(tmp_path):
    path = released_file(tmp_path / 'released.pth', 'sem_fpn', 16)
    marker = tmp_path / 'ran'
    evil = hide_payload(path, marker, tmp_path / 'evil.pth')
    with pytest.raises(CheckpointError, match='refused'):
        read_checkpoint(str(evil))
    assert not marker.exists()


def test_finetune_on_other_classes_leaves_exactly_the_class_layers(tmp_path, demo_data):
    path = released_file(tmp_path / 'released.pth', 'mask_rcnn', 16)
    model = model_of(tmp_path, 'mask_rcnn', 16, demo_data, num_classes=5)
    left = check_finetune_fits(model, str(path))
    assert [k.split(' ')[0] for k in left] == [
        'roi_head.bbox_head.fc_cls.weight', 'roi_head.bbox_head.fc_cls.bias',
        'roi_head.bbox_head.fc_reg.weight', 'roi_head.bbox_head.fc_reg.bias',
        'roi_head.mask_head.conv_logits.weight', 'roi_head.mask_head.conv_logits.bias']
    missing = released_state('mask_rcnn', 16)
    del missing['roi_head.bbox_head.shared_fcs.1.bias']
    other_width = released_state('mask_rcnn', 16)
    other_width['rpn_head.rpn_conv.bias'] = torch.zeros(8)
    for state, named in ((missing, r'missing .*shared_fcs\.1\.bias'),
                         (other_width, r'outside the class-dependent layers: rpn_head\.rpn_conv\.bias')):
        with pytest.raises(CheckpointError, match=named):
            check_finetune_fits(model, str(released_file(tmp_path / 'bad.pth', 'mask_rcnn', 16, state)))


def test_classes_and_palette_reach_the_inferencer(tmp_path, demo_data):
    from xcit_dense.inference import build_inferencer
    path = released_file(tmp_path / 'released.pth', 'sem_fpn', 16)
    ckpt = read_checkpoint(str(path))
    assert 'optimizer' not in ckpt and 'amp' not in ckpt
    inferencer = build_inferencer(str(tiny_config(tmp_path, 'sem_fpn', 16, demo_data)), str(path), device='cpu')
    assert tuple(inferencer.model.dataset_meta['classes']) == SEG_CLASSES
    assert [list(c) for c in inferencer.model.dataset_meta['palette']][1] == [220, 20, 60]


def test_converter_writes_a_strictly_loading_file(tmp_path, demo_data, capsys):
    path = released_file(tmp_path / 'released.pth', 'mask_rcnn', 8)
    run_tool_in_process('tools/model_converters/convert_xcit_checkpoint.py', path, tmp_path / 'out.pth')
    printed = capsys.readouterr().out
    assert ('mapped backbone.pos_embeder.token_projection.weight -> '
            'backbone.pos_embed.token_projection.weight') in printed
    assert 'XCiT backbone of patch 8, 32 dims, 4 blocks' in printed and 'dropped optimizer, amp' in printed
    converted = torch.load(tmp_path / 'out.pth', weights_only=True)
    assert converted['meta']['dataset_meta']['classes'] == SHAPES
    model = model_of(tmp_path, 'mask_rcnn', 8, demo_data)
    model.load_state_dict(converted['state_dict'], strict=True)


def test_tta_evaluates_a_released_file(tmp_path, demo_data):
    """--tta: the ADE20K base's six scales and flip around the model, every weight of the file loaded."""
    config = tiny_config(tmp_path, 'upernet', 16, demo_data)
    path = released_file(tmp_path / 'released.pth', 'upernet', 16)
    run_tool_in_process('tools/test.py', config, path, '--tta', '--work-dir', tmp_path / 'tta',
                        '--out', tmp_path / 'tta.pkl',
                        '--cfg-options', 'test_dataloader.dataset.reduce_zero_label=True',
                        'test_dataloader.dataset.indices=1')  # one image: 12 passes of the model
    log = next((tmp_path / 'tta').glob('*/*.log')).read_text()
    assert 'mIoU' in log and 'do not match exactly' not in log and 'missing keys' not in log
    merged, = load_results(tmp_path / 'tta.pkl')  # the 12 passes merged into one prediction
    assert merged['scale_factor'] == (1.75, 1.75) and merged['flip']  # the last of the augmentations
    from mmengine.config import Config
    cfg = Config.fromfile(str(config))
    ratios = [t['scale_factor'] for t in cfg.tta_pipeline[1]['transforms'][0]]
    assert ratios == [0.5, 0.75, 1.0, 1.25, 1.5, 1.75] and cfg.tta_model.type == 'SegTTAModel'


def test_vis_attention_reads_a_released_file(tmp_path, demo_data):
    from xcit_dense.analysis.vis_attention import load_model
    config = str(tiny_config(tmp_path, 'upernet', 16, demo_data))
    raw = released_state('upernet', 16)
    backbone, is_classifier = load_model(config, str(released_file(tmp_path / 'p16.pth', 'upernet', 16, raw)))
    assert not is_classifier
    assert torch.equal(backbone.pos_embed.token_projection.weight, raw['backbone.pos_embeder.token_projection.weight'])
    with pytest.raises(ValueError, match='patch 8, 32 dims, 4 blocks.*patch 16, 32 dims, 4 blocks'):
        load_model(config, str(released_file(tmp_path / 'p8.pth', 'upernet', 8)))
