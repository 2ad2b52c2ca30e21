"""tools/model_converters/publish_model.py on the session's trained work dir (trained_tiny_seg: no
training here), and the folder it writes used by tools/infer.py and tools/test.py in place of CONFIG
CHECKPOINT: the same predictions and metric as the checkpoint, its config.py never run without
--trust-config, damaged weights and bad overrides refused; and by tools/deployment/export_onnx.py. Every
tool runs in this process (run_tool_in_process)."""
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import cached_hub_repo, run_tool_in_process
from safetensors.torch import load_file

from xcit_dense.analysis import onnx_export
from xcit_dense.io.checkpoint import read_checkpoint_file, write_checkpoint

RECIPE = 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py'
PUBLISH = 'tools/model_converters/publish_model.py'
EXPORT = 'tools/deployment/export_onnx.py'


@pytest.fixture(scope='module')
def published(tmp_path_factory, trained_tiny_seg) -> Path:
    """The folder PUBLISH writes of the trained run's last checkpoint (read-only for the tests: those that
    change it take a copy)."""
    config, work_dir = trained_tiny_seg
    out = tmp_path_factory.mktemp('published')
    proc = run_tool_in_process(PUBLISH, work_dir / 'iter_4.pth', out, '--config', config, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = out.iterdir()
    return folder


def one_line_refusal(proc, text: str) -> None:
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    assert text in proc.stderr, proc.stderr[-3000:]


def predictions(out_dir: Path) -> list:
    """results.json's predictions, without the pictures' paths."""
    images = json.loads((out_dir / 'results.json').read_text())['images']
    return [{k: v for k, v in image.items() if k != 'picture'} for image in images]


def test_the_folder_holds_weights_recipe_digest_and_figures(published, trained_tiny_seg):
    """model.json names the recipe of configs/ the run's _base_ reaches, the digest of model.safetensors
    (whose first 8 hex name the folder) and the run's last validation; the card repeats them."""
    config, work_dir = trained_tiny_seg
    assert sorted(p.name for p in published.iterdir()) == ['README.md', 'config.py', 'model.json', 'model.safetensors']
    description = json.loads((published / 'model.json').read_text())
    digest = hashlib.sha256((published / 'model.safetensors').read_bytes()).hexdigest()
    assert published.name == f'{config.stem}-{digest[:8]}' and description['weights']['sha256'] == digest
    assert description['recipe'] == RECIPE and description['weights']['ema_average'] is False
    over = description['overrides']
    assert over['classes'] == ['background', 'rectangle', 'ellipse', 'triangle'] and over['num_classes'] == 4
    assert over['image_scale'] is None and over['model']['backbone']['embed_dims'] == 64
    validated = json.loads(next(work_dir.glob('*/vis_data/scalars.json')).read_text().splitlines()[-1])
    assert description['figures']['metrics']['mIoU'] == validated['mIoU']
    card = (published / 'README.md').read_text()
    assert RECIPE in card and digest in card and 'mIoU' in card and 'Apache License' in card
    assert (published / 'config.py').read_bytes() == config.read_bytes()


def test_infer_with_the_folder_predicts_as_with_the_checkpoint(tmp_path, published, trained_tiny_seg, seg_data):
    """The recipe and model.json's overrides rebuild the run's model: the same predictions, class names too."""
    config, work_dir = trained_tiny_seg
    images = seg_data / 'images' / 'validation'
    proc = run_tool_in_process('tools/infer.py', config, work_dir / 'iter_4.pth', images,
                               '--out-dir', tmp_path / 'ckpt', '--device', 'cpu', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_tool_in_process('tools/infer.py', published, images, '--out-dir', tmp_path / 'pub',
                               '--device', 'cpu', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert predictions(tmp_path / 'pub') == predictions(tmp_path / 'ckpt') and len(predictions(tmp_path / 'pub')) == 4
    assert json.loads((tmp_path / 'pub' / 'results.json').read_text())['classes'][1] == 'rectangle'


def test_test_tool_with_the_folder_scores_what_the_run_validated(tmp_path, published, trained_tiny_seg, seg_data):
    """tools/test.py FOLDER (the recipe's ADE20K test set pointed at the test images by --cfg-options) gives
    the mIoU the run's own validation of those weights gave."""
    _, work_dir = trained_tiny_seg
    data = 'test_dataloader.dataset'
    proc = run_tool_in_process(
        'tools/test.py', published, '--work-dir', tmp_path / 'eval', '--cfg-options', f'{data}.type=BaseSegDataset',
        f'{data}.data_root={seg_data}', f'{data}.data_prefix.img_path=images/validation',
        f'{data}.data_prefix.seg_map_path=annotations/validation', f'{data}.reduce_zero_label=False',
        f'{data}.pipeline.1.reduce_zero_label=False', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    validated = json.loads(next(work_dir.glob('*/vis_data/scalars.json')).read_text().splitlines()[-1])
    assert float(re.findall(r'mIoU: ([0-9.]+)', proc.stdout)[-1]) == round(validated['mIoU'], 2)


def test_the_folders_config_runs_only_with_trust_config_and_never_from_the_hub(tmp_path, published, seg_data,
                                                                              offline_hub_cache):
    """A config.py that writes a file: not run by infer on the folder nor on the hub repository holding it
    (--trust-config refused there); run with --trust-config on the local folder, which is what it is for."""
    folder, marker = tmp_path / 'model', tmp_path / 'config-ran'
    shutil.copytree(published, folder)
    (folder / 'config.py').write_text((published / 'config.py').read_text()
                                      + f'\nopen({str(marker)!r}, "w").write("ran")\n')
    image = next((seg_data / 'images' / 'validation').iterdir())
    proc = run_tool_in_process('tools/infer.py', folder, image, '--out-dir', tmp_path / 'a', '--device', 'cpu',
                               cwd=tmp_path)
    assert proc.returncode == 0 and not marker.exists(), proc.stderr[-3000:]
    cached_hub_repo(offline_hub_cache, 'someone/tiny-seg', {
        name: (lambda path, name=name: shutil.copyfile(folder / name, path))
        for name in ('model.json', 'model.safetensors', 'config.py')})
    proc = run_tool_in_process('tools/infer.py', 'hf-hub:someone/tiny-seg', image, '--out-dir', tmp_path / 'b',
                               '--device', 'cpu', cwd=tmp_path)
    assert proc.returncode == 0 and not marker.exists(), proc.stderr[-3000:]
    assert predictions(tmp_path / 'b') == predictions(tmp_path / 'a')
    proc = run_tool_in_process('tools/test.py', 'hf-hub:someone/tiny-seg', '--trust-config', cwd=tmp_path)
    one_line_refusal(proc, 'error: --trust-config is for a local folder: the config.py of hf-hub:someone/tiny-seg '
                           'is never run')
    assert not marker.exists()
    proc = run_tool_in_process('tools/infer.py', folder, image, '--trust-config', '--out-dir', tmp_path / 'c',
                               '--device', 'cpu', cwd=tmp_path)
    assert proc.returncode == 0 and marker.read_text() == 'ran', proc.stderr[-3000:]


def test_weights_of_another_digest_and_a_bad_override_are_refused(tmp_path, published, seg_data):
    """A model.safetensors whose sha256 is not model.json's, and an override of the wrong type: one line each."""
    folder = tmp_path / 'model'
    shutil.copytree(published, folder)
    image = next((seg_data / 'images' / 'validation').iterdir())
    data = bytearray((folder / 'model.safetensors').read_bytes())
    data[-1] ^= 1
    (folder / 'model.safetensors').write_bytes(bytes(data))
    proc = run_tool_in_process('tools/infer.py', folder, image, '--out-dir', tmp_path / 'a', cwd=tmp_path)
    one_line_refusal(proc, "model.json says")
    assert 'refused (damaged or replaced weights)' in proc.stderr
    shutil.copyfile(published / 'model.safetensors', folder / 'model.safetensors')
    description = json.loads((folder / 'model.json').read_text())
    description['overrides']['model']['backbone']['depth'] = 'four'
    (folder / 'model.json').write_text(json.dumps(description))
    proc = run_tool_in_process('tools/test.py', folder, cwd=tmp_path)
    one_line_refusal(proc, "overrides: model.backbone.depth='four': expected")  # config_check's, on XCiT's signature


def test_publish_refuses_a_missing_or_corrupt_checkpoint_a_used_folder_and_a_link(tmp_path, published,
                                                                                  trained_tiny_seg):
    config, work_dir = trained_tiny_seg
    proc = run_tool_in_process(PUBLISH, tmp_path / 'none.pth', tmp_path, '--config', config,
                               cwd=tmp_path)
    one_line_refusal(proc, f'error: checkpoint file not found: {tmp_path / "none.pth"}')
    (tmp_path / 'bad.pth').write_bytes(b'PK\x03\x04 not a checkpoint')
    proc = run_tool_in_process(PUBLISH, tmp_path / 'bad.pth', tmp_path, '--config', config,
                               cwd=tmp_path)
    one_line_refusal(proc, f'error: cannot read checkpoint {tmp_path / "bad.pth"}')
    proc = run_tool_in_process(PUBLISH, work_dir / 'iter_4.pth', tmp_path, cwd=tmp_path)
    one_line_refusal(proc, 'through its _base_ chain')  # the merged copy in the work dir names no recipe
    used = tmp_path / 'used' / published.name
    used.mkdir(parents=True)
    (used / 'notes.txt').write_text('mine')
    proc = run_tool_in_process(PUBLISH, work_dir / 'iter_4.pth', used.parent, '--config', config,
                               cwd=tmp_path)
    one_line_refusal(proc, f'error: {used} exists and is not an empty folder')
    assert [p.name for p in used.iterdir()] == ['notes.txt']
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (tmp_path / 'linked').mkdir()
    (tmp_path / 'linked' / published.name).symlink_to(elsewhere)
    proc = run_tool_in_process(PUBLISH, work_dir / 'iter_4.pth', tmp_path / 'linked', '--config',
                               config, cwd=tmp_path)
    one_line_refusal(proc, 'is a symbolic link: the toolkit never writes through one')
    assert not list(elsewhere.iterdir())


def test_an_ema_checkpoint_publishes_its_average_and_says_so(tmp_path, trained_tiny_seg):
    """A checkpoint with ``ema_state_dict`` (the trained run's, given one): model.safetensors holds its
    state_dict, the average the tools take by default, and model.json and the card say so."""
    config, work_dir = trained_tiny_seg
    ckpt = read_checkpoint_file(str(work_dir / 'iter_4.pth'))
    trained = {k: v + 1 for k, v in ckpt['state_dict'].items()}
    ckpt['ema_state_dict'] = {'steps': torch.tensor(4), **{f'module.{k}': v for k, v in trained.items()}}
    write_checkpoint(ckpt, str(tmp_path / 'ema.pth'))
    proc = run_tool_in_process(PUBLISH, tmp_path / 'ema.pth', tmp_path / 'out', '--config', config,
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = (tmp_path / 'out').iterdir()
    assert json.loads((folder / 'model.json').read_text())['weights']['ema_average'] is True
    assert 'the EMA average of the trained weights' in (folder / 'README.md').read_text()
    published = load_file(folder / 'model.safetensors')
    assert published.keys() == ckpt['state_dict'].keys()
    assert all(torch.equal(published[k], v) for k, v in ckpt['state_dict'].items())


def test_the_export_tool_takes_the_folder_or_an_ema_checkpoints_average(tmp_path, published, trained_tiny_seg,
                                                                        monkeypatch):
    """tools/deployment/export_onnx.py FOLDER OUT --whole exports the model of the recipe and model.json's
    overrides with the folder's weights, model.json's classes in the file's metadata; CONFIG --checkpoint
    of a checkpoint trained with --ema exports its average, not the trained weights; a folder with
    --checkpoint is refused. The trace (tens of seconds; tests/integration/test_infer_onnx.py runs it) is
    replaced by a recorder of what would be traced."""
    traced = []
    monkeypatch.setattr(onnx_export, 'export', lambda module, path, shape, names, dynamic=True, metadata=None:
                        traced.append((module.model.state_dict(), json.loads((metadata or {})['classes']))))
    proc = run_tool_in_process(EXPORT, published, tmp_path / 'model.onnx', '--whole', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (state, classes), = traced
    weights = load_file(published / 'model.safetensors')
    assert weights.keys() <= state.keys() and all(torch.equal(state[k], v) for k, v in weights.items())
    assert classes == ['background', 'rectangle', 'ellipse', 'triangle']
    config, work_dir = trained_tiny_seg
    ckpt = read_checkpoint_file(str(work_dir / 'iter_4.pth'))
    ckpt['ema_state_dict'] = {'steps': torch.tensor(4), **{f'module.{k}': v + 1 for k, v in ckpt['state_dict'].items()}}
    write_checkpoint(ckpt, str(tmp_path / 'ema.pth'))
    proc = run_tool_in_process(EXPORT, config, tmp_path / 'model.onnx', '--whole', '--checkpoint', tmp_path / 'ema.pth',
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = traced[-1][0]
    assert all(torch.equal(state[k], v) for k, v in ckpt['state_dict'].items() if k in state)
    proc = run_tool_in_process(EXPORT, published, tmp_path / 'model.onnx', '--checkpoint', tmp_path / 'ema.pth',
                               cwd=tmp_path)
    assert proc.returncode == 2 and 'give it without --checkpoint' in proc.stderr, proc.stderr[-3000:]
